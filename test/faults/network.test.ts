/**
 * Fault scenario 4: a bad network between device A and the hub, through the
 * fault proxy: latency with bytes delivered a few at a time, connections
 * reset again and again in the middle of a backlog, and a path that goes
 * silent without a FIN. Everything A acknowledged reaches device B once
 * and in order when the network is good again; a dead path is noticed
 * within three heartbeats.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { freePort, tmpDir, waitFor } from "../helpers.ts";
import { fleet, runAgent, type AgentProc } from "../integration/agent-process.ts";
import { FaultProxy } from "../integration/fault-proxy.ts";

const HEARTBEAT = 500;
let hub: AgentProc, devA: AgentProc, devB: AgentProc;
let proxy: FaultProxy;

const api = (a: AgentProc, method: string, path: string, body?: string, type = "application/json") =>
  fetch(`http://k${path}`, { method, body, headers: { "content-type": type }, unix: a.socket } as RequestInit).then((r) => r.json() as Promise<any>);

/** Publishes `n` messages on A in NDJSON batches of 500; returns their ids in order. */
async function publish(channel: string, n: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i += 500) {
    const body = Array.from({ length: Math.min(500, n - i) }, (_, k) => JSON.stringify({ type: "n", payload: i + k })).join("\n");
    ids.push(...(await api(devA, "POST", `/v1/channels/${channel}/messages`, body, "application/x-ndjson")).results.map((r: any) => r.id));
  }
  return ids;
}

/** Reads `channel` on B from the start until `n` messages came (or the deadline); returns their ids. */
async function arrived(channel: string, n: number, ms = 60_000): Promise<string[]> {
  const ids: string[] = [];
  await waitFor(
    async () => {
      const r = await api(devB, "GET", `/v1/channels/${channel}/messages?subscriber=check&from=earliest&max=10000&wait=200`);
      if (r.messages?.length) {
        ids.push(...r.messages.map((m: any) => m.id));
        await api(devB, "POST", `/v1/channels/${channel}/subscribers/check/ack`, JSON.stringify({ seq: r.messages.at(-1).seq }));
      }
      return ids.length >= n;
    },
    `${n} messages of ${channel} at B`,
    ms,
    20,
  );
  return ids;
}

const linkState = async () => (await api(devA, "GET", "/v1/status")).links[0]?.state;

beforeAll(async () => {
  const dir = tmpDir();
  const tls = await fleet(dir, ["hub", "devA", "devB"]);
  const port = freePort();
  proxy = new FaultProxy(port);
  const fed = `federation:\n  heartbeat_ms: ${HEARTBEAT}ms\n  reconnect_base_ms: 50ms\n  reconnect_max_ms: 300ms\n  max_batch_bytes: 64KiB\n`;
  const cfg = (n: string, body: string) => {
    writeFileSync(join(dir, `${n}.yaml`), tls(n) + fed + body);
    return join(dir, `${n}.yaml`);
  };
  hub = await runAgent(join(dir, "hub"), [
    "--config",
    cfg("hub", `hub:\n  listen: 127.0.0.1:${port}\n  peers:\n    - name: devA\n      publish: ["n.>"]\n      subscribe: []\n    - name: devB\n      publish: []\n      subscribe: ["n.>"]\n`),
  ]);
  devA = await runAgent(join(dir, "devA"), ["--config", cfg("devA", `links:\n  - hub: 127.0.0.1:${proxy.port}\n    publish: ["n.>"]\n    subscribe: []\n`)]);
  devB = await runAgent(join(dir, "devB"), ["--config", cfg("devB", `links:\n  - hub: 127.0.0.1:${port}\n    publish: []\n    subscribe: ["n.>"]\n`)]);
  await waitFor(async () => (await linkState()) === "open" && (await api(devB, "GET", "/v1/status")).links[0]?.state === "open", "links open", 20_000);
}, 60_000);

afterAll(async () => {
  proxy.stop();
  for (const a of [devA, devB, hub]) {
    a.child.proc.kill("SIGTERM");
    await a.child.proc.exited;
  }
});

describe("a bad network between device A and the hub", () => {
  test("50 ms each way, bytes delivered 64 at a time: everything arrives once, in order", async () => {
    // About 64 KB/s: slow, yet a 16 KiB TLS record still arrives within the three heartbeats
    // (1.5 s here) that a silent link gets; on a link slower than that, heartbeat_ms must grow.
    proxy.delayMs = 50;
    proxy.chunkBytes = 64;
    try {
      const t0 = Date.now();
      const ids = await publish("n.slow", 300);
      expect(await arrived("n.slow", ids.length)).toEqual(ids);
      console.log(`slow network: ${ids.length} messages in ${Date.now() - t0} ms, ${(await api(devA, "GET", "/v1/status")).links[0].reconnects} reconnects`);
    } finally {
      proxy.delayMs = 0;
      proxy.chunkBytes = 0;
    }
  }, 120_000);

  test("connections reset every 150 ms while a 5,000-message backlog flows: once each, in order", async () => {
    const ids = await publish("n.reset", 5000);
    let resetting = true;
    const resets = (async () => {
      while (resetting) {
        await Bun.sleep(150);
        proxy.cut();
      }
    })();
    // Let the resets hit the flow for a while, then let the network be good again.
    await waitFor(() => proxy.cuts >= 10, "ten resets", 30_000);
    resetting = false;
    await resets;
    const got = await arrived("n.reset", ids.length);
    expect(got).toEqual(ids);
  }, 120_000);

  test("a silent path (no FIN) is noticed within three heartbeats; held and new messages arrive after", async () => {
    await waitFor(async () => (await linkState()) === "open", "link open");
    proxy.blackholed = true;
    const t0 = Date.now();
    const ids = await publish("n.silent", 100);
    await waitFor(async () => (await linkState()) !== "open", "dead link noticed", 10_000, 20);
    expect(Date.now() - t0).toBeLessThan(3 * HEARTBEAT + HEARTBEAT / 4 + 1000);
    proxy.heal();
    proxy.cut(); // the old, silent connection goes; the link reconnects through the healthy path
    expect(await arrived("n.silent", ids.length)).toEqual(ids);
  }, 60_000);
});
