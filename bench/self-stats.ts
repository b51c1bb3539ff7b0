/**
 * The in-process path benchmarks' common parts (mqtt-path.ts, hub-path.ts,
 * device-path.ts):
 * what this process did, read from /proc (minor page faults, voluntary
 * context switches, CPU by kind of thread), the loop that feeds a path one
 * message at a time or paced, and the JSON line each prints.
 */
import { heapStats } from "bun:jsc";
import { mkdtempSync, readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Agent } from "../src/agent/agent.ts";
import { parseConfig } from "../src/config/schema.ts";
import { buildEnvelope } from "../src/envelope/build.ts";
import { MessageIds } from "../src/envelope/message-id.ts";
import { batchFrame } from "../src/federation/messages.ts";
import { silentLogger } from "../src/observability/logger.ts";

/** Minor page faults (/proc/self/stat) and voluntary context switches of all threads so far. */
export function faults(): { minor: number; switches: number } {
  const stat = readFileSync("/proc/self/stat", "utf8");
  const minor = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[7]);
  let switches = 0;
  for (const t of readdirSync("/proc/self/task")) {
    try {
      const m = /voluntary_ctxt_switches:\s+(\d+)/.exec(readFileSync(`/proc/self/task/${t}/status`, "utf8"));
      switches += Number(m?.[1] ?? 0);
    } catch {
      // a thread that ended meanwhile
    }
  }
  return { minor, switches };
}

/** CPU ms of each thread kind so far (schedstat), by thread name. */
export function threadTimes(): Record<string, number> {
  const out: Record<string, number> = {};
  for (const t of readdirSync("/proc/self/task")) {
    try {
      const comm = readFileSync(`/proc/self/task/${t}/comm`, "utf8")
        .trim()
        .replace(/[0-9]+$/, "");
      const ns = Number(readFileSync(`/proc/self/task/${t}/schedstat`, "utf8").split(" ")[0]);
      out[comm] = Math.round((out[comm] ?? 0) + ns / 1e6);
    } catch {
      // a thread that ended meanwhile
    }
  }
  return out;
}

/** What came out at the end of the path so far; each arrival wakes the driver. */
export class Arrivals {
  count = 0;
  private wake: (() => void) | null = null;

  /** `n` more arrived (0: something came out, not a message). */
  add(n: number): void {
    this.count += n;
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  /** Resolves at the next `add`. */
  next(): Promise<void> {
    return new Promise<void>((r) => (this.wake = r));
  }
}

/** CPU, wall time, faults and switches of one run. */
export interface RunCost {
  cpuUs: number;
  wallMs: number;
  minorFaults: number;
  switches: number;
}

/**
 * The inputs of a run, made before anything is measured and packed into one
 * buffer outside the JavaScript heap, as a socket's reads arrive; the path
 * is fed a view of each. (Kept as arrays of their own, a run's hundred
 * thousand inputs were marked by every collection, and the same build's
 * runs differed by up to 2x.)
 */
export class Inputs {
  private readonly bytes: Uint8Array;
  private readonly ends: Float64Array;

  /** `n` inputs, the i-th made by `make(i)`. */
  constructor(n: number, make: (i: number) => Uint8Array) {
    const parts = Array.from({ length: n }, (_, i) => make(i));
    this.ends = new Float64Array(n);
    let size = 0;
    for (let i = 0; i < n; i++) this.ends[i] = size += parts[i]!.length;
    this.bytes = new Uint8Array(new ArrayBuffer(size));
    for (let i = 0; i < n; i++) this.bytes.set(parts[i]!, this.ends[i]! - parts[i]!.length);
  }

  get length(): number {
    return this.ends.length;
  }

  /** A view of the i-th input. */
  at(i: number): Uint8Array {
    return this.bytes.subarray(i === 0 ? 0 : this.ends[i - 1]!, this.ends[i]!);
  }
}

/**
 * Feeds `inputs` into the path: with `rate` 0 each waits for the one before
 * it to arrive (a board's rate as the agent sees it: every message alone),
 * else one every 1/rate s. Returns once all have arrived.
 */
export async function drive(inputs: Inputs, feed: (input: Uint8Array) => void, out: Arrivals, rate: number): Promise<RunCost> {
  const target = out.count + inputs.length;
  const t0 = performance.now();
  const f0 = faults();
  const c0 = process.cpuUsage();
  for (let i = 0; i < inputs.length; i++) {
    if (rate > 0) {
      const wait = t0 + (i * 1000) / rate - performance.now();
      if (wait > 0) await Bun.sleep(wait);
      feed(inputs.at(i));
    } else {
      const before = out.count;
      feed(inputs.at(i));
      while (out.count === before) await out.next();
    }
  }
  while (out.count < target) await out.next();
  const c = process.cpuUsage(c0);
  const f1 = faults();
  return { cpuUs: c.user + c.system, wallMs: performance.now() - t0, minorFaults: f1.minor - f0.minor, switches: f1.switches - f0.switches };
}

/**
 * Feeds `warm` inputs, then measures `segments` runs of `n` inputs each
 * (a full collection before each). A path's cost moves within one process
 * by up to 2x from one second to the next (collections, the allocator
 * returning pages: its page faults move with it), so a run is several
 * segments and its figure their median.
 */
export async function measure(make: (i: number) => Uint8Array, feed: (input: Uint8Array) => void, out: Arrivals, o: { n: number; warm: number; rate: number; segments: number }): Promise<RunCost[]> {
  // Built before anything is measured (and before the profile that a run may take).
  const warm = new Inputs(o.warm, make);
  const segments = Array.from({ length: o.segments }, () => new Inputs(o.n, make));
  await drive(warm, feed, out, o.rate);
  const costs: RunCost[] = [];
  for (const inputs of segments) {
    Bun.gc(true);
    costs.push(await drive(inputs, feed, out, o.rate));
  }
  return costs;
}

/**
 * The cells (objects of the JavaScript heap) each input leaves behind, by
 * type: the heap's counts after a full collection, and again after `n`
 * inputs fed one at a time, after `warm` to warm up. A count of garbage,
 * deterministic where CPU time is not: for an A/B of a change that makes
 * fewer objects. It holds only when no collection ran in between; a weakly
 * held object made just before the window tells (a young collection takes
 * it), and the line then says so: take a smaller `n`. The harness's own
 * cells are in it (the promise it awaits per input and its functions,
 * about five).
 */
export async function cellsPerInput(workload: string, make: (i: number) => Uint8Array, feed: (input: Uint8Array) => void, out: Arrivals, warm: number, n: number): Promise<string> {
  await drive(new Inputs(warm, make), feed, out, 0);
  const inputs = new Inputs(n, make);
  Bun.gc(true);
  const canary = new WeakRef({ canary: true });
  const statsBefore = heapStats();
  const before = statsBefore.objectTypeCounts;
  await drive(inputs, feed, out, 0);
  const statsAfter = heapStats();
  const after = statsAfter.objectTypeCounts;
  const collected = canary.deref() === undefined;
  const byType = Object.entries(after)
    .map(([type, count]) => [type, Math.round(((count - (before[type] ?? 0)) / n) * 100) / 100] as const)
    .filter(([, perInput]) => Math.abs(perInput) >= 0.05)
    .sort((a, b) => b[1] - a[1]);
  const total = Math.round(byType.reduce((sum, [, v]) => sum + v, 0) * 10) / 10;
  return JSON.stringify({
    workload: `${workload}, cells per input (fed one at a time)`,
    inputs: n,
    cellsPerInput: collected ? null : total,
    // The memory outside the heap reported to it (the bytes of buffers that are not small typed
    // arrays), per input; it counts toward the next collection as cells do. (The heap's own size
    // moves only when a collection measures it, so cells are counted by type above instead.)
    extraBytesPerInput: collected ? null : Math.round((statsAfter.extraMemorySize - statsBefore.extraMemorySize) / n),
    byType: collected ? null : Object.fromEntries(byType),
    note: collected ? "a collection ran in the window: no count; take a smaller --cells" : undefined,
  });
}

/** The JSON line of measured segments of `n` messages each: the median segment's figures, and every segment's CPU. */
export function report(workload: string, sync: string, n: number, segments: RunCost[]): string {
  const sorted = [...segments].sort((a, b) => a.cpuUs - b.cpuUs);
  const r = sorted[(sorted.length - 1) >> 1]!;
  return JSON.stringify({
    workload,
    sync,
    messages: n,
    cpuUsPerMsg: Math.round((r.cpuUs / n) * 10) / 10,
    segmentsCpuUsPerMsg: segments.map((x) => Math.round((x.cpuUs / n) * 10) / 10),
    wallUsPerMsg: Math.round((r.wallMs * 1000) / n),
    minorFaultsPerMsg: Math.round((r.minorFaults / n) * 100) / 100,
    wakeupsPerMsg: Math.round((r.switches / n) * 100) / 100,
    rssMB: Math.round(process.memoryUsage().rss / 1e5) / 10,
    threadsMs: threadTimes(),
    bound: "process CPU (one thread of JS, the log writes)",
  });
}

/** The options every path benchmark takes: --n (per segment), --warm, --segments, --rate, --sync, --cells (count cells per input over that many instead of timing). */
export function pathOptions(): { n: number; warm: number; segments: number; rate: number; sync: "none" | "always"; cells: number } {
  const arg = (name: string, fallback: string): string => {
    const a = process.argv.find((x) => x.startsWith(`--${name}=`));
    return a ? a.slice(name.length + 3) : fallback;
  };
  return {
    n: Number(arg("n", "20000")),
    warm: Number(arg("warm", "60000")),
    segments: Number(arg("segments", "5")),
    rate: Number(arg("rate", "0")),
    sync: arg("sync", "none") as "none" | "always",
    cells: Number(arg("cells", "0")),
  };
}

/** A real agent with an MQTT listener, its data in a new temporary directory (removed by the caller). */
export async function mqttAgent(name: string, sync: "none" | "always"): Promise<{ agent: Agent; dir: string }> {
  const dir = mkdtempSync(join(tmpdir(), `keyop-${name}-path-`));
  const cfg = parseConfig({
    name,
    storage: { data_dir: join(dir, "data"), sync },
    api: { socket: join(dir, "k.sock") },
    mqtt: { listen: "127.0.0.1:0" },
  });
  return { agent: await Agent.start(cfg, silentLogger), dir };
}

/** BATCH frames of one record each (a 200-byte payload published on A) on `channel`, as a forwarder writes them. */
export function oneRecordBatches(channel: string): () => Uint8Array {
  const payload = "x".repeat(200);
  let seq = 0;
  const ids = new MessageIds();
  return () => {
    seq++;
    const env = buildEnvelope("a", { channel, type: "t", payload }, 1 << 20, ids);
    return batchFrame({ batch: seq, channel, seqs: [seq], records: [env.body], delayAck: true });
  };
}
