/**
 * Local API benchmarks (issue 3), against `keyop run` as a separate process:
 * single-message publishes over 64 keep-alive connections, NDJSON batches,
 * stream delivery to one subscriber (with acks), and the agent's idle RSS.
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import type { Row } from "./lib.ts";
import { agentHealthy, spawnReady, stopProc } from "./procs.ts";
import { RawHttp } from "./raw-http.ts";

const MAIN = join(import.meta.dir, "..", "src", "main.ts");
const PAYLOAD = "x".repeat(256);

/** A `keyop run` child process for benchmarks. */
export interface BenchAgent {
  proc: ReturnType<typeof Bun.spawn>;
  socket: string;
  dir: string;
  stop(): Promise<void>;
}

/** Starts `keyop run` on a fresh directory and waits for its socket. */
export async function startAgent(sync = "always", extra: string[] = []): Promise<BenchAgent> {
  const dir = mkdtempSync(join(process.env.KEYOP_BENCH_DIR ?? tmpdir(), "keyop-bench-api-"));
  const cfg = join(dir, "k.yaml");
  await Bun.write(cfg, `storage:\n  data_dir: ${dir}/data\n  sync: ${sync}\napi:\n  socket: ${dir}/k.sock\nlog:\n  level: warn\n`);
  const socket = join(dir, "k.sock");
  const proc = await spawnReady([process.execPath, MAIN, "run", "--config", cfg, ...extra], agentHealthy(socket), "keyop agent", { stderr: "inherit" });
  return {
    proc,
    socket,
    dir,
    async stop() {
      await stopProc(proc);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** RSS of a process in MB, from /proc. */
export function rssOf(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) / 1024 : NaN;
}

/**
 * The anonymous part of the RSS in MB (heap, stacks: what the process
 * allocated). The rest of the RSS is pages of the executable mapped from the
 * page cache, shared with every other Bun process and varying with how much
 * of the binary the kernel has faulted in: 36 MB one hour, 49 MB the next
 * for the same idle agent.
 */
export function anonOf(pid: number): number {
  const m = /RssAnon:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) / 1024 : NaN;
}

/**
 * Sends `req` over `conns` keep-alive connections, one request in flight on
 * each, for `seconds`; counts `perRequest` messages per 201 answer.
 */
async function drive(socket: string, req: Uint8Array, conns: number, seconds: number, perRequest: number): Promise<{ rate: number; errors: number }> {
  const clients = await Promise.all(Array.from({ length: conns }, () => RawHttp.connect(socket)));
  let n = 0;
  let errors = 0;
  const t0 = performance.now();
  const end = t0 + seconds * 1000;
  await Promise.all(
    clients.map(async (c) => {
      while (performance.now() < end) {
        const r = await c.send(req);
        if (r.status === 201) n += perRequest;
        else errors++;
      }
    }),
  );
  const rate = n / ((performance.now() - t0) / 1000);
  for (const c of clients) c.close();
  return { rate, errors };
}

/** `conns` connections each publishing one message at a time for `seconds`. */
export function publishRate(socket: string, conns: number, seconds: number): Promise<{ rate: number; errors: number }> {
  const req = RawHttp.request("POST", "/v1/channels/bench.api/messages", JSON.stringify({ type: "t", payload: PAYLOAD }));
  return drive(socket, req, conns, seconds, 1);
}

/** NDJSON batches of `batch` messages from `conns` connections for `seconds`. */
async function batchRate(socket: string, conns: number, batch: number, seconds: number): Promise<number> {
  const line = JSON.stringify({ type: "t", payload: PAYLOAD });
  const req = RawHttp.request("POST", "/v1/channels/bench.batch/messages", Array(batch).fill(line).join("\n") + "\n", "application/x-ndjson");
  const r = await drive(socket, req, conns, seconds, batch);
  if (r.errors > 0) throw new Error(`${r.errors} batch publishes were refused`);
  return r.rate;
}

/** Streams `total` stored messages to one subscriber, acking every 1000; messages/s. */
async function streamRate(socket: string, total: number): Promise<number> {
  const line = JSON.stringify({ type: "t", payload: PAYLOAD });
  const pub = await RawHttp.connect(socket);
  const req = RawHttp.request("POST", "/v1/channels/bench.stream/messages", Array(5000).fill(line).join("\n") + "\n", "application/x-ndjson");
  for (let i = 0; i < total; i += 5000) await pub.send(req);
  pub.close();
  const acker = await RawHttp.connect(socket);
  const t0 = performance.now();
  const res = await fetch("http://k/v1/channels/bench.stream/stream?subscriber=bench&from=earliest&max_inflight=5000", { unix: socket } as RequestInit);
  const dec = new TextDecoder();
  let rest = "";
  let got = 0;
  let acking: Promise<unknown> = Promise.resolve();
  for await (const chunk of res.body as AsyncIterable<Uint8Array>) {
    rest += dec.decode(chunk, { stream: true });
    const lines = rest.split("\n");
    rest = lines.pop()!;
    let last = 0;
    for (const l of lines) {
      if (!l) continue;
      last = (JSON.parse(l) as { seq: number }).seq;
      got++;
    }
    if (last && got % 1000 < lines.length) {
      await acking;
      acking = acker.send(RawHttp.request("POST", "/v1/channels/bench.stream/subscribers/bench/ack", JSON.stringify({ seq: last })));
    }
    if (got >= total) break;
  }
  const rate = got / ((performance.now() - t0) / 1000);
  await acking;
  acker.close();
  return rate;
}

/** Runs every API scenario and returns its rows. */
export async function benchApi(opts: { quick?: boolean } = {}): Promise<Row[]> {
  const secs = opts.quick ? 2 : 5;
  const rows: Row[] = [];
  let agent = await startAgent();
  await Bun.sleep(1000);
  rows.push({ group: "agent", metric: "idle RSS of keyop run", value: rssOf(agent.proc.pid), unit: "MB", note: "target < 40 MB" });
  rows.push({ group: "agent", metric: "idle RSS of keyop run, anonymous part", value: anonOf(agent.proc.pid), unit: "MB", note: "the rest is the executable's pages from the page cache" });
  const single = await publishRate(agent.socket, 64, secs);
  rows.push({ group: "api sync=always", metric: "publish, 64 connections", value: single.rate, unit: "msg/s", note: `target >= 40,000${single.errors ? `; ${single.errors} errors` : ""}` });
  const one = await publishRate(agent.socket, 1, secs);
  rows.push({ group: "api sync=always", metric: "publish, 1 connection", value: one.rate, unit: "msg/s" });
  rows.push({ group: "api sync=always", metric: "NDJSON batches of 1000, 4 connections", value: await batchRate(agent.socket, 4, 1000, secs), unit: "msg/s", note: "target >= 200,000" });
  rows.push({ group: "api sync=always", metric: "RSS after the publish runs", value: rssOf(agent.proc.pid), unit: "MB" });
  await agent.stop();
  agent = await startAgent();
  rows.push({ group: "api", metric: "stream to 1 subscriber (acks every 1000)", value: await streamRate(agent.socket, opts.quick ? 100_000 : 300_000), unit: "msg/s", note: "target >= 100,000" });
  await agent.stop();
  agent = await startAgent("none");
  const none = await publishRate(agent.socket, 64, secs);
  rows.push({ group: "api sync=none", metric: "publish, 64 connections", value: none.rate, unit: "msg/s" });
  await agent.stop();
  return rows;
}
