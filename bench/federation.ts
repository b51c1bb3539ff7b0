/**
 * Federation benchmarks (issue 5), with real `keyop run` processes and
 * `sync: always` on every hop: end-to-end latency device A -> hub -> device
 * B at 1,000 msg/s, the forwarding rate of a 100,000-message backlog when
 * the hub comes back, and the hub's RSS with 100 connected clients.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadTlsMaterial } from "../src/pki/tls.ts";
import { connectMtls } from "../src/pki/mtls.ts";
import { type PeerSession, sessionHandler } from "../src/federation/session.ts";
import { silentLogger } from "../src/observability/logger.ts";
import { quantile, type Row } from "./lib.ts";
import { rssOf } from "./api.ts";
import { RawHttp } from "./raw-http.ts";
import { channelMessages, paced, start, startTrio, status, stop, streamCount, until } from "./fed-lib.ts";

const CLIENTS = 100;

/** Runs the federation scenarios; returns table rows. */
export async function benchFederation(opts: { quick?: boolean } = {}): Promise<Row[]> {
  const rows: Row[] = [];
  const dir = mkdtempSync(join(process.env.KEYOP_BENCH_DIR ?? tmpdir(), "keyop-bench-fed-"));
  const names = Array.from({ length: CLIENTS }, (_, i) => `c${i}`);
  const trio = await startTrio(dir, { extraPeers: names });
  let hub = trio.hub;
  const { devA, devB, port, hubYaml } = trio;
  try {
    // 1. Hub RSS with 100 more connected clients (idle sessions from this process), on a fresh hub.
    const rssBefore = rssOf(hub.proc.pid);
    let opened = 0;
    for (let i = 0; i < CLIENTS; i++) {
      const m = await loadTlsMaterial({ cert: join(dir, `c${i}.crt`), key: join(dir, `c${i}.key`), ca: join(dir, "ca.crt") });
      await connectMtls<PeerSession>(
        { hostname: "127.0.0.1", port, material: m, logger: silentLogger },
        sessionHandler({ role: "client", maxBody: 1 << 20, heartbeatMs: 10_000, logger: silentLogger }, { onOpen: () => void opened++ }, (s) =>
          s.sendHello({ versions: [1], name: `c${i}`, mode: "link", publish: [], subscribe: [], heartbeatMs: 10_000, maxBatchBytes: 1 << 20 }),
        ),
      );
    }
    await until("100 clients open", async () => opened >= CLIENTS);
    await Bun.sleep(1000);
    rows.push({ group: "federation hub", metric: `RSS with ${CLIENTS + 2} connected clients`, value: rssOf(hub.proc.pid), unit: "MB", note: `${rssBefore.toFixed(1)} MB with 2; target < 100 MB` });

    // 2. End-to-end latency at 1,000 msg/s: the payload carries the wall-clock send time.
    const seconds = opts.quick ? 3 : 10;
    const lat: number[] = [];
    const s1 = streamCount(devB, "t.lat", (m) => lat.push(performance.timeOrigin + performance.now() - m.payload.t));
    const conns = await Promise.all(Array.from({ length: 8 }, () => RawHttp.connect(devA.socket)));
    // Two seconds at the same rate first, not measured: the first second of a fresh process is
    // JIT compilation (event-loop stalls of 10-200 ms in all three agents), not steady state.
    const warmup = 2000;
    await paced(conns, warmup);
    await until("warm-up delivered", async () => lat.length >= warmup, 30_000);
    lat.length = 0;
    const total = seconds * 1000;
    await paced(conns, total);
    await until("all latency messages at B", async () => lat.length >= total, 30_000);
    s1.stop();
    for (const c of conns) c.close();
    rows.push({ group: "federation A->hub->B @1000/s", metric: "p50", value: quantile(lat, 0.5), unit: "ms", note: "sync always on all three" });
    rows.push({ group: "federation A->hub->B @1000/s", metric: "p99", value: quantile(lat, 0.99), unit: "ms", note: "target < 15 ms" });
    rows.push({ group: "federation A->hub->B @1000/s", metric: "max", value: quantile(lat, 1), unit: "ms", note: `${lat.length} messages after ${warmup} of warm-up` });

    // 3. Backlog: hub down while A stores N messages; time until B has them all after the hub starts.
    const n = opts.quick ? 20_000 : 100_000;
    await stop(hub);
    const line = JSON.stringify({ type: "n", payload: "y".repeat(200) });
    const pub = await RawHttp.connect(devA.socket);
    const batch = RawHttp.request("POST", "/v1/channels/t.backlog/messages", Array(5000).fill(line).join("\n") + "\n", "application/x-ndjson");
    for (let i = 0; i < n; i += 5000) await pub.send(batch);
    pub.close();
    const th = performance.now();
    hub = await start(dir, "hub", hubYaml);
    // Time the forwarding itself: from the moment A's link is up again.
    await until("A linked again", async () => (await status(devA)).links[0]?.state === "open", 30_000);
    const tb = performance.now();
    // Forwarded = stored (durably) in B's log; B's channel stats say how many, without a consumer
    // on B taking CPU from the three agents (delivery to subscribers is measured by the API bench).
    await until("backlog stored at B", async () => (await channelMessages(devB, "t.backlog")) >= n, 120_000);
    const secs = (performance.now() - tb) / 1000;
    rows.push({
      group: "federation backlog",
      metric: `${n.toLocaleString("en-US")} messages A->hub->B once the link is up`,
      value: n / secs,
      unit: "msg/s",
      note: `${secs.toFixed(2)} s until stored at B (+${((tb - th) / 1000).toFixed(1)} s hub start and reconnect); target >= 50,000`,
    });
  } finally {
    for (const p of [devA, devB, hub]) await stop(p).catch(() => {});
    rmSync(dir, { recursive: true, force: true });
  }
  return rows;
}
