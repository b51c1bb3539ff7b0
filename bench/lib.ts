/**
 * Benchmark plumbing shared by every bench script: timing helpers, exact
 * percentiles over recorded samples, the printed table and the JSON file
 * under bench/results/.
 */
import { dlopen } from "bun:ffi";
import { closeSync, fdatasyncSync, mkdirSync, openSync, rmSync, writeFileSync, writeSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { join } from "node:path";

/** One row of a results table. */
export interface Row {
  group: string;
  metric: string;
  value: number;
  unit: string;
  /** What the figure is compared with, and the target, in words. */
  note?: string;
}

/** Exact quantile of `samples` (sorted in place). */
export function quantile(samples: number[], q: number): number {
  if (samples.length === 0) return NaN;
  samples.sort((a, b) => a - b);
  return samples[Math.min(samples.length - 1, Math.max(0, Math.ceil(q * samples.length) - 1))]!;
}

/** Formats a number for the table: 3 significant digits, thousands separated. */
export function fmt(v: number): string {
  if (!Number.isFinite(v)) return String(v);
  if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString("en-US");
  return Number(v.toPrecision(3)).toString();
}

/** Prints rows as an aligned table. */
export function printTable(title: string, rows: Row[]): void {
  const w = [5, 6, 5, 4].map((n, i) => Math.max(n, ...rows.map((r) => [r.group, r.metric, fmt(r.value), r.unit][i]!.length)));
  console.log(`\n${title}`);
  const line = (c: string[]) =>
    console.log(
      c
        .map((s, i) => (i === 2 ? s.padStart(w[i]!) : s.padEnd(w[i]!)))
        .join("  ")
        .trimEnd(),
    );
  line(["group", "metric", "value", "unit", "note"]);
  line(w.map((n) => "-".repeat(n)).concat("----"));
  for (const r of rows) line([r.group, r.metric, fmt(r.value), r.unit, r.note ?? ""]);
}

/** The machine and runtime, stated next to every figure. */
export function machine(): Record<string, unknown> {
  return {
    cpus: cpus().length,
    cpu_model: cpus()[0]?.model,
    mem_gb: Math.round(totalmem() / 2 ** 30),
    bun: Bun.version,
    platform: `${process.platform}-${process.arch}`,
  };
}

/** Writes `bench/results/<date>-<name>.json` and returns its path. */
export function writeResults(name: string, rows: Row[], extra: Record<string, unknown> = {}): string {
  const dir = join(import.meta.dir, "results");
  mkdirSync(dir, { recursive: true });
  const stamp = new Date().toISOString().replace(/[:]/g, "").replace(/\..*/, "");
  const path = join(dir, `${stamp}-${name}.json`);
  writeFileSync(path, JSON.stringify({ name, at: new Date().toISOString(), machine: machine(), rows, ...extra }, null, 2) + "\n");
  return path;
}

/** Resident set size of this process in MB. */
export function rssMB(): number {
  return process.memoryUsage().rss / 2 ** 20;
}

/**
 * Mean µs of a 256-byte write + fdatasync into a preallocated file in `dir`
 * (as keyop's log writes: no size change to commit), `count` times. The
 * disk's latency moves by a factor of two within an hour on these shared
 * machines and a fsyncing server's rate moves with it: measured next to
 * each round, it says which conditions a round ran under.
 */
export function diskFloorUs(dir: string, count = 200): number {
  const path = join(dir, `floor-${process.pid}`);
  const fd = openSync(path, "w");
  try {
    const rec = new Uint8Array(256).fill(7);
    const zeros = new Uint8Array(count * rec.length);
    writeSync(fd, zeros, 0, zeros.length, 0);
    fdatasyncSync(fd);
    const t0 = performance.now();
    for (let i = 0; i < count; i++) {
      writeSync(fd, rec, 0, rec.length, i * rec.length);
      fdatasyncSync(fd);
    }
    return ((performance.now() - t0) * 1000) / count;
  } finally {
    closeSync(fd);
    rmSync(path, { force: true });
  }
}

/**
 * Mean ns of one trivial system call (getppid, through libc, which does not
 * cache it). On this paravirtualized VM the price of a kernel entry has
 * moved about threefold between sessions, with the host. A server that
 * makes a dozen syscalls per message (Mosquitto reads a packet in four
 * reads and toggles EPOLLOUT around each PUBACK) moves with it far more
 * than one that batches a window per read and write; measured beside each
 * round, it says which kind of host a comparison ran on.
 */
export function syscallNs(count = 100_000): number {
  const libc = dlopen("libc.so.6", { getppid: { args: [], returns: "i32" } });
  try {
    const getppid = libc.symbols.getppid;
    for (let i = 0; i < 1000; i++) getppid();
    const t0 = Bun.nanoseconds();
    for (let i = 0; i < count; i++) getppid();
    return (Bun.nanoseconds() - t0) / count;
  } finally {
    libc.close();
  }
}

/** Calls `send(i)` at `rate` per second, `total` times, at most `inflight` unresolved at once. */
export async function pace(rate: number, total: number, inflight: number, send: (i: number) => unknown): Promise<void> {
  const t0 = performance.now();
  let sent = 0;
  const pending = new Set<Promise<unknown>>();
  while (sent < total) {
    const due = Math.min(total, Math.floor(((performance.now() - t0) * rate) / 1000) + 1);
    while (sent < due) {
      const p = send(sent++);
      if (p instanceof Promise) {
        const q: Promise<unknown> = p.then(() => pending.delete(q));
        pending.add(q);
        if (pending.size >= inflight) await Promise.race(pending);
      }
    }
    await Bun.sleep(Math.max(1, t0 + (sent * 1000) / rate - performance.now()));
  }
  await Promise.all(pending);
}

/**
 * `pairs` rounds of two measurements in the order A B, B A, A B... so that
 * a drift of the machine within a pair falls on both; `each` gets A's and
 * B's result of every pair, in order.
 */
export async function alternating<T>(pairs: number, a: () => Promise<T>, b: () => Promise<T>, each: (x: T, y: T, pair: number) => void): Promise<void> {
  for (let i = 0; i < pairs; i++) {
    if (i % 2 === 0) {
      const x = await a();
      each(x, await b(), i);
    } else {
      const y = await b();
      each(await a(), y, i);
    }
  }
}

/** `--name=value` from this process's arguments, or `def`. */
export function arg(name: string, def: string): string {
  return process.argv.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? def;
}

/** "K=V K2=V2" (an `--env-a`/`--env-b` argument) as an environment to add. */
export function envOf(s: string): Record<string, string> {
  return Object.fromEntries(
    s
      .split(" ")
      .filter(Boolean)
      .map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)]),
  );
}

/** `n` concurrent loops calling `fn` for `secs`; operations per second. */
export async function workers(n: number, secs: number, fn: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  const end = t0 + secs * 1000;
  let count = 0;
  await Promise.all(
    Array.from({ length: n }, async () => {
      while (performance.now() < end) {
        await fn();
        count++;
      }
    }),
  );
  return count / ((performance.now() - t0) / 1000);
}
