/**
 * Fault scenario 7: a soak at 2,000 msg/s through device -> hub -> device,
 * the RSS of all three sampled as it runs. After the warm-up (the first
 * third), no agent's RSS peak may grow by 10% or more, and every message
 * must arrive. 30 s in `npm test`; KEYOP_FAULT_LONG=1 runs 5 minutes, sampling
 * every 10 s.
 */
import { afterAll, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { tmpDir, waitFor } from "../helpers.ts";
import { cli, runAgent, type AgentProc } from "../integration/agent-process.ts";

const SECONDS = process.env.KEYOP_FAULT_LONG ? 300 : 30;
const SAMPLE_MS = process.env.KEYOP_FAULT_LONG ? 10_000 : 2_000;
const RATE = 2000;
const agents: AgentProc[] = [];

afterAll(async () => {
  for (const a of agents) {
    a.child.proc.kill("SIGTERM");
    await a.child.proc.exited;
  }
});

const rssMB = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))![1]) / 1024;

test(`soak: ${SECONDS} s at ${RATE} msg/s through two hops, RSS flat after warm-up, nothing lost`, async () => {
  const dir = tmpDir();
  const pki = join(dir, "pki");
  expect((await cli(["cert", "ca", "--out-dir", pki])).code).toBe(0);
  for (const n of ["hub", "devA", "devB"]) expect((await cli(["cert", "issue", "--name", n, "--ca-dir", pki, "--out-dir", pki, "--ip", "127.0.0.1"])).code).toBe(0);
  const l = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const port = l.port;
  l.stop(true);
  const tls = (n: string) => `tls:\n  cert: ${pki}/${n}.crt\n  key: ${pki}/${n}.key\n  ca: ${pki}/ca.crt\n`;
  const cfg = (n: string, body: string) => {
    writeFileSync(join(dir, `${n}.yaml`), tls(n) + body);
    return join(dir, `${n}.yaml`);
  };
  const hub = await runAgent(join(dir, "hub"), ["--config", cfg("hub", `hub:\n  listen: 127.0.0.1:${port}\n  peers:\n    - name: devA\n      publish: ["s.>"]\n      subscribe: []\n    - name: devB\n      publish: []\n      subscribe: ["s.>"]\n`)]);
  const devA = await runAgent(join(dir, "devA"), ["--config", cfg("devA", `links:\n  - hub: 127.0.0.1:${port}\n    publish: ["s.>"]\n    subscribe: []\n`)]);
  const devB = await runAgent(join(dir, "devB"), ["--config", cfg("devB", `links:\n  - hub: 127.0.0.1:${port}\n    publish: []\n    subscribe: ["s.>"]\n`)]);
  agents.push(hub, devA, devB);
  const status = async (a: AgentProc) => (await (await fetch("http://k/v1/status", { unix: a.socket } as RequestInit)).json()) as any;
  await waitFor(async () => (await status(devA)).links[0]?.state === "open" && (await status(devB)).links[0]?.state === "open", "links open", 20_000);

  // A consumer on B, acking as it reads (so B's retention is not pinned by it).
  let received = 0;
  const ctl = new AbortController();
  const consumer = (async () => {
    const res = await fetch("http://k/v1/channels/s.soak/stream?subscriber=sink&from=earliest&auto_ack=true", { unix: devB.socket, signal: ctl.signal } as RequestInit);
    const dec = new TextDecoder();
    try {
      for await (const chunk of res.body as AsyncIterable<Uint8Array>) received += dec.decode(chunk).split("\n").filter((x) => x.startsWith("{")).length;
    } catch {
      // aborted at the end
    }
  })();

  // 2,000 msg/s as batches of 20 every 10 ms; RSS sampled as it goes.
  const samples: number[][] = [];
  let sent = 0;
  const t0 = performance.now();
  let nextSample = t0 + SAMPLE_MS;
  const batch = Array.from({ length: 20 }, () => JSON.stringify({ type: "n", payload: { pad: "x".repeat(200) } })).join("\n");
  while (performance.now() - t0 < SECONDS * 1000) {
    const r = await fetch("http://k/v1/channels/s.soak/messages", { method: "POST", body: batch, headers: { "content-type": "application/x-ndjson" }, unix: devA.socket } as RequestInit);
    expect(r.status).toBe(201);
    await r.arrayBuffer();
    sent += 20;
    if (performance.now() >= nextSample) {
      samples.push([hub, devA, devB].map((a) => rssMB(a.child.proc.pid)));
      nextSample += SAMPLE_MS;
    }
    await Bun.sleep(Math.max(1, t0 + (sent * 1000) / RATE - performance.now()));
  }
  await waitFor(() => received >= sent, `all ${sent} messages at B`, 60_000, 20);
  ctl.abort();
  await consumer;

  // The RSS of a JavaScript process is a sawtooth (the heap grows, a collection gives it back),
  // so growth is peak against peak: the last third of the samples against the middle third
  // (the first third is the warm-up). A leak raises every peak.
  const third = Math.floor(samples.length / 3);
  const report = ["hub", "devA", "devB"].map((name, k) => {
    const series = samples.map((s) => s[k]!);
    const middle = Math.max(...series.slice(third, 2 * third));
    const last = Math.max(...series.slice(2 * third));
    return { name, middle, last, growth: (last - middle) / middle, series: series.map((v) => v.toFixed(1)).join(" ") };
  });
  for (const r of report) console.log(`soak ${r.name}: RSS ${r.series} MB; peak ${r.middle.toFixed(1)} MB in the middle third, ${r.last.toFixed(1)} MB in the last (${(r.growth * 100).toFixed(1)}%)`);
  console.log(`soak: ${sent} published, ${received} received in ${SECONDS} s`);
  expect(received).toBe(sent);
  for (const r of report) expect({ name: r.name, growthUnder10pct: r.growth < 0.1 }).toEqual({ name: r.name, growthUnder10pct: true });
}, (SECONDS + 120) * 1000);
