/**
 * Step 10 of `npm run bench:compare`: queue-group throughput. A backlog of
 * messages waits on one subscriber; 1, 2 or 4 worker processes
 * (bench/queue-worker.ts: `LocalClient.subscribe` with `queue: true`,
 * HTTP over the Unix socket, one HTTP ack per message) drain it as
 * members of its queue group.
 *
 * Two kinds of work: 5 ms of waiting per message (the worker waits on
 * something else, a database or a device: workers add up), and none (the
 * cost of the group itself: bound by CPU, the agent's and the workers'
 * HTTP, on this machine's 2 cores). Throughput is taken between 10% and 90%
 * of the backlog acked, when every worker has joined; CPU per message from
 * /proc for the agent (including the bench's own reads of /v1/channels,
 * every 100 ms) and for all the workers together.
 */
import { join } from "node:path";
import { type Proc, start, stop, until } from "./fed-lib.ts";
import type { Row } from "./lib.ts";
import { spawnReady, stopProc } from "./procs.ts";
import { costBetween, type Servers, snapshotOf } from "./servers.ts";

export interface QueueBenchOptions {
  servers: Servers;
  quick: boolean;
}

const WORKER = join(import.meta.dir, "queue-worker.ts");

async function cursorOf(p: Proc, channel: string, name: string): Promise<number> {
  const list = ((await (await fetch("http://k/v1/channels", { unix: p.socket } as RequestInit)).json()) as { channels: { channel: string; subscribers: { name: string; cursor: number }[] }[] })
    .channels;
  return list.find((c) => c.channel === channel)?.subscribers.find((s) => s.name === name)?.cursor ?? 0;
}

async function publishBacklog(p: Proc, channel: string, n: number): Promise<void> {
  const line = JSON.stringify({ type: "job", payload: { pad: "x".repeat(200) } });
  for (let done = 0; done < n; done += 1000) {
    const body =
      Array(Math.min(1000, n - done))
        .fill(line)
        .join("\n") + "\n";
    const r = await fetch(`http://k/v1/channels/${channel}/messages`, { method: "POST", body, headers: { "content-type": "application/x-ndjson" }, unix: p.socket } as RequestInit);
    if (!r.ok) throw new Error(`publish failed: ${r.status} ${await r.text()}`);
  }
}

interface Drain {
  rate: number;
  agentUs: number;
  workersUs: number;
}

/** Drains `n` messages with `k` workers doing `workMs` each; figures between 10% and 90%. */
async function drain(o: QueueBenchOptions, k: number, workMs: number, n: number): Promise<Drain> {
  const dir = o.servers.dir(`queue-${k}-${workMs}`);
  const a = await start(dir, "agent", "");
  const workers: ReturnType<typeof Bun.spawn>[] = [];
  try {
    const channel = "jobs";
    const name = "workers";
    // The subscriber exists before the backlog, at its start.
    await fetch(`http://k/v1/channels/${channel}/messages?subscriber=${name}&from=earliest&max=1`, { unix: a.socket } as RequestInit);
    await publishBacklog(a, channel, n);
    for (let i = 0; i < k; i++) {
      workers.push(await spawnReady([process.execPath, WORKER, a.socket, channel, name, String(workMs), "16"], async () => true, `queue worker ${i}`, { stderr: "inherit" }));
    }
    const pids = () => workers.map((w) => w.pid);
    const lo = Math.floor(n * 0.1);
    const hi = Math.floor(n * 0.9);
    let c = 0;
    // The rate is taken from the cursors read and the times between, so polling often buys nothing
    // and would show in the agent's CPU (a read of /v1/channels every 100 ms).
    await until("10% acked", async () => (c = await cursorOf(a, channel, name)) > lo, 120_000, 100);
    const t0 = performance.now();
    const c0 = c;
    const s0a = snapshotOf([a.proc.pid]);
    const s0w = snapshotOf(pids());
    await until("90% acked", async () => (c = await cursorOf(a, channel, name)) > hi, 300_000, 100);
    const secs = (performance.now() - t0) / 1000;
    const done = c - c0;
    const agentCpu = costBetween(s0a, snapshotOf([a.proc.pid])).cpu;
    const workersCpu = costBetween(s0w, snapshotOf(pids())).cpu;
    await until("all acked", async () => (await cursorOf(a, channel, name)) === n + 1, 300_000, 20);
    return { rate: done / secs, agentUs: (agentCpu / done) * 1e6, workersUs: (workersCpu / done) * 1e6 };
  } finally {
    for (const w of workers) await stopProc(w);
    await stop(a);
  }
}

export async function queueGroups(o: QueueBenchOptions): Promise<Row[]> {
  const G = "10 queue group";
  const rows: Row[] = [];
  for (const workMs of [5, 0]) {
    const n = o.quick ? 2000 : workMs > 0 ? 6000 : 20_000;
    let one = 0;
    for (const k of [1, 2, 4]) {
      console.log(`  queue group: ${k} worker(s), ${workMs} ms of work each`);
      const d = await drain(o, k, workMs, n);
      if (k === 1) one = d.rate;
      const what = `${k} worker${k > 1 ? "s" : ""}, ${workMs} ms work`;
      rows.push({
        group: G,
        metric: `${what}: throughput`,
        value: d.rate,
        unit: "msg/s",
        note: `${(d.rate / one).toFixed(2)}x one worker; ${workMs > 0 ? `ideal ${Math.round((1000 / workMs) * k)} (work alone)` : "bound by CPU (2 cores: agent and workers)"}; backlog ${n}, 10%..90%`,
      });
      rows.push({ group: G, metric: `${what}: agent CPU per message`, value: d.agentUs, unit: "µs", note: `workers' CPU per message ${Math.round(d.workersUs)} µs (HTTP stream + one HTTP ack each)` });
    }
  }
  return rows;
}
