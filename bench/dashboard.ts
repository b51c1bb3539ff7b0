/**
 * The dashboard of a hub with 5,000 peers: what a snapshot costs the agent
 * (time, CPU, bytes sent every 2 s) and what rendering it costs the page
 * in headless Chromium.
 *
 *   bun bench/dashboard.ts [--peers N]
 *
 * The hub is real code on a real log (its Messenger, a Federation with N
 * configured peers, each with its durable cursor `_fed.<peer>` and a
 * backlog on its own command channel), not listening: the fleet table is
 * built from the configuration and the cursors, as for peers that are
 * offline, which is the costlier case (their backlogs are read from the
 * cursors; a connected peer's comes from its forwarder).
 */
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import puppeteer from "puppeteer-core";
import { parseConfig } from "../src/config/schema.ts";
import { DashboardServer } from "../src/dashboard/server.ts";
import { History } from "../src/dashboard/history.ts";
import { SnapshotBuilder } from "../src/dashboard/snapshot.ts";
import { Federation } from "../src/federation/federation.ts";
import { Messenger } from "../src/messenger/messenger.ts";
import { Histogram } from "../src/observability/histogram.ts";
import { silentLogger } from "../src/observability/logger.ts";
import { createCa, issueCert } from "../src/pki/certs.ts";
import { loadTlsMaterial } from "../src/pki/tls.ts";
import { quantile, type Row, printTable, writeResults } from "./lib.ts";
import { freePort } from "./servers.ts";

const arg = process.argv.find((a) => a.startsWith("--peers="));
const N = arg ? Number(arg.slice("--peers=".length)) : 5000;
const dir = join("/tmp", `keyop-bench-dashboard-${process.pid}`);
mkdirSync(dir, { recursive: true });

const ca = await createCa();
const hubCert = await issueCert(ca, { name: "hub", ip: ["127.0.0.1"] });
writeFileSync(join(dir, "ca.crt"), ca.certPem);
writeFileSync(join(dir, "hub.crt"), hubCert.certPem);
writeFileSync(join(dir, "hub.key"), hubCert.keyPem);
const material = await loadTlsMaterial({ cert: join(dir, "hub.crt"), key: join(dir, "hub.key"), ca: join(dir, "ca.crt") });
const cfg = parseConfig({
  storage: { data_dir: join(dir, "data"), sync: "none" },
  tls: { cert: join(dir, "hub.crt"), key: join(dir, "hub.key"), ca: join(dir, "ca.crt") },
  hub: { listen: "127.0.0.1:0", peers: Array.from({ length: N }, (_, i) => ({ name: `board-${i}`, publish: ["t.>"], subscribe: [`cmd.board-${i}.>`] })) },
});
const m = await Messenger.open({ name: "hub", storage: { dataDir: cfg.storage.dataDir, sync: "none" }, logger: silentLogger });
console.log(`  ${N} peers: cursors and backlogs`);
for (let i = 0; i < N; i++) m.openSubscriber(`cmd.board-${i}.>`, `_fed.board-${i}`, { from: "earliest" }).touch(Date.now() - i * 1000);
// A backlog for every tenth peer: two commands waiting.
for (let i = 0; i < N; i += 10) await m.publishBatch([0, 1].map((k) => ({ channel: `cmd.board-${i}.run`, type: "cmd", payload: { k } })));
const fed = new Federation(m, { hub: cfg.hub, links: [], federation: cfg.federation, dedup: cfg.dedup, audit: cfg.audit }, material, silentLogger);
const history = new History({ published: () => m.publishedTotal(), histograms: () => m.histograms() }, Histogram.bound);
const builder = new SnapshotBuilder({
  messenger: m,
  federation: fed,
  history,
  agent: () => ({ name: "hub", version: "bench", uptimeS: 0, role: "hub", sync: "none", offlineAfterMs: 300_000 }),
});

const ms: number[] = [];
const cpuMs: number[] = [];
let bytes = 0;
for (let i = 0; i < 20; i++) {
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  const text = JSON.stringify(await builder.build());
  ms.push(performance.now() - t0);
  const c = process.cpuUsage(c0);
  cpuMs.push((c.user + c.system) / 1000);
  bytes = text.length;
}
const rows: Row[] = [];
const G = "dashboard";
rows.push({
  group: G,
  metric: `snapshot of ${N} peers: build + JSON, p50`,
  value: quantile(ms, 0.5),
  unit: "ms",
  note: `max ${Math.max(...ms).toFixed(1)} ms over 20; the first ${ms[0]!.toFixed(1)} ms (oldest-message ages read once)`,
});
rows.push({
  group: G,
  metric: `snapshot of ${N} peers: agent CPU`,
  value: quantile(cpuMs, 0.5),
  unit: "ms",
  note: `every 2 s while a page is open: ${((quantile(cpuMs, 0.5) / 2000) * 100).toFixed(1)}% of a core`,
});
rows.push({ group: G, metric: `snapshot of ${N} peers: size`, value: bytes / 1024, unit: "KiB", note: "GET /api/snapshot; a page's SSE gets it whole once, then what changed" });

const chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].find((p) => existsSync(p));
if (chromium) {
  const port = freePort();
  const dash = DashboardServer.start({
    config: { listen: `127.0.0.1:${port}`, tls: false, users: [], offlineAfterMs: 300_000 },
    tls: undefined,
    logger: silentLogger,
    snapshot: () => builder.build(),
  });
  // What a page receives: the whole snapshot once, then updates every 2 s.
  {
    const ctl = new AbortController();
    const res = await fetch(`http://127.0.0.1:${port}/api/events`, { signal: ctl.signal });
    const sizes: number[] = [];
    let buf = "";
    const dec = new TextDecoder();
    const reading = (async () => {
      try {
        for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
          buf += dec.decode(chunk, { stream: true });
          for (let i = buf.indexOf("\n\n"); i >= 0; i = buf.indexOf("\n\n")) {
            const ev = buf.slice(0, i);
            buf = buf.slice(i + 2);
            if (ev.startsWith("event:")) sizes.push(ev.length);
          }
          if (sizes.length >= 6) ctl.abort();
        }
      } catch {
        // aborted
      }
    })();
    await reading;
    const updates = sizes.slice(1);
    rows.push({ group: G, metric: `SSE to a page, ${N} peers: first (whole) snapshot`, value: sizes[0]! / 1024, unit: "KiB", note: "sent once, when the page opens" });
    rows.push({
      group: G,
      metric: `SSE to a page, ${N} peers: update every 2 s, p50`,
      value: quantile(updates, 0.5) / 1024,
      unit: "KiB",
      note: `max ${(Math.max(...updates) / 1024).toFixed(1)} KiB over ${updates.length} (rows that changed; chart points when new)`,
    });
  }
  const browser = await puppeteer.launch({ executablePath: chromium, headless: true, args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1400, height: 1000 });
    await page.goto(`http://127.0.0.1:${port}/`, { waitUntil: "domcontentloaded" });
    const renders: number[] = [];
    let last = "";
    const end = performance.now() + 30_000;
    while (renders.length < 10 && performance.now() < end) {
      await Bun.sleep(200);
      const r = (await page.evaluate("document.body.dataset.renderMs || ''")) as string;
      const live = (await page.evaluate("document.getElementById('live').textContent")) as string;
      if (r && live !== last) {
        renders.push(Number(r));
        last = live;
      }
    }
    rows.push({
      group: G,
      metric: `page render of ${N} peers, p50`,
      value: quantile(renders, 0.5),
      unit: "ms",
      note: `max ${Math.max(...renders).toFixed(1)} ms over ${renders.length} snapshots; the table shows 500 rows of the filtered, sorted ${N}`,
    });
  } finally {
    await browser.close();
    dash.stop();
  }
}
await m.close();
printTable("keyop dashboard", rows);
console.log(`results: ${writeResults("dashboard", rows, { peers: N })}`);
