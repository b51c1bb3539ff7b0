/**
 * Storage and Messenger benchmarks (issue 2): publish throughput by sync
 * mode and concurrency against the bare write+fdatasync floor on the same
 * disk, publish-to-handler latency at a fixed rate, open time of a 1 GB log,
 * and RSS with an empty log versus a 1,000,000-message backlog.
 */
import { closeSync, fdatasyncSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs";
import { open } from "node:fs/promises";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { Messenger, type SyncMode } from "../src/index.ts";
import { encodeEnvelope } from "../src/envelope/envelope.ts";
import { ChannelLog } from "../src/store/channel-log.ts";
import { silentLogger } from "../src/observability/logger.ts";
import { quantile, type Row } from "./lib.ts";

const PAYLOAD = "x".repeat(256);
const root = () => mkdtempSync(join(process.env.KEYOP_BENCH_DIR ?? tmpdir(), "keyop-bench-"));

/** Sequential 256-byte write + fdatasync: the floor a durable publish cannot beat. */
async function bareFsync(seconds: number): Promise<{ syncOpsPerSec: number; promiseOpsPerSec: number }> {
  const dir = root();
  const buf = new Uint8Array(256 + 16).fill(7);
  const fd = openSync(join(dir, "f"), "w");
  let n = 0;
  let pos = 0;
  let end = performance.now() + seconds * 1000;
  while (performance.now() < end) {
    writeSync(fd, buf, 0, buf.length, pos);
    pos += buf.length;
    fdatasyncSync(fd);
    n++;
  }
  const syncOps = n / seconds;
  closeSync(fd);
  const fh = await open(join(dir, "g"), "w");
  n = 0;
  pos = 0;
  end = performance.now() + seconds * 1000;
  while (performance.now() < end) {
    writeSync(fh.fd, buf, 0, buf.length, pos);
    pos += buf.length;
    await fh.datasync();
    n++;
  }
  await fh.close();
  rmSync(dir, { recursive: true, force: true });
  return { syncOpsPerSec: syncOps, promiseOpsPerSec: n / seconds };
}

/** `workers` loops each awaiting one publish at a time for `seconds`. */
async function publishRate(sync: SyncMode, workers: number, seconds: number): Promise<number> {
  const dir = root();
  const m = await Messenger.open({ name: "bench", storage: { dataDir: dir, sync } });
  await m.publish("bench.warmup", "t", PAYLOAD);
  let n = 0;
  const end = performance.now() + seconds * 1000;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: workers }, async () => {
      while (performance.now() < end) {
        await m.publish("bench.ingest", "t", PAYLOAD);
        n++;
      }
    }),
  );
  const rate = n / ((performance.now() - t0) / 1000);
  await m.close();
  rmSync(dir, { recursive: true, force: true });
  return rate;
}

/**
 * Flushes dirty pages system-wide so a scenario does not pay for the
 * writeback of the one before it (a `sync: none` run leaves hundreds of MB).
 */
function settle(): void {
  Bun.spawnSync(["sync"]);
}

/** Publish-to-handler latency at a steady `rate` msg/s under sync always. */
async function handlerLatency(rate: number, seconds: number): Promise<{ p50: number; p99: number; max: number; n: number; fsyncP99: number }> {
  const dir = root();
  const m = await Messenger.open({ name: "bench", storage: { dataDir: dir } });
  const sent = new Map<number, number>();
  const samples: number[] = [];
  let warm = 0;
  await m.subscribe("bench.lat", "lat", (msg) => {
    const i = (msg.payload as { i: number }).i;
    if (i < 0) return void warm++;
    samples.push(performance.now() - sent.get(i)!);
    sent.delete(i);
  });
  // Warm up: the channel exists (no mkdir/dir fsync in the figures) and the code paths are compiled.
  for (let k = 1; k <= 200; k++) await m.publish("bench.lat", "t", { i: -k, p: PAYLOAD });
  while (warm < 200) await Bun.sleep(1);
  const total = rate * seconds;
  const t0 = performance.now();
  let i = 0;
  while (i < total) {
    const due = Math.min(total, Math.floor(((performance.now() - t0) / 1000) * rate) + 1);
    while (i < due) {
      sent.set(i, performance.now());
      void m.publish("bench.lat", "t", { i, p: PAYLOAD });
      i++;
    }
    // Sleep until the next message is due (a sub-millisecond sleep spins).
    await Bun.sleep(Math.max(1, t0 + (i * 1000) / rate - performance.now()));
  }
  const deadline = performance.now() + 10_000;
  while (samples.length < total && performance.now() < deadline) await Bun.sleep(5);
  const fsync = m.stats().latency.fsync;
  await m.close();
  rmSync(dir, { recursive: true, force: true });
  return { p50: quantile(samples, 0.5), p99: quantile(samples, 0.99), max: quantile(samples, 1), n: samples.length, fsyncP99: fsync.p99 };
}

/** Writes `count` 256-byte-payload envelopes into one channel, or until `bytes`. */
async function buildLog(dir: string, limit: { count?: number; bytes?: number }): Promise<number> {
  const log = await ChannelLog.open(
    "bench.backlog",
    join(dir, "channels", "bench.backlog"),
    {
      segmentBytes: 64 * 1024 * 1024,
      sync: "none",
      syncIntervalMs: 1000,
      tailCacheBytes: 0,
      logger: silentLogger,
    },
    { create: true },
  );
  let n = 0;
  while ((limit.count === undefined || n < limit.count) && (limit.bytes === undefined || log.bytes < limit.bytes)) {
    const batch: Promise<number>[] = [];
    for (let k = 0; k < 10_000 && (limit.count === undefined || n < limit.count); k++, n++) {
      batch.push(log.append(encodeEnvelope({ id: Bun.randomUUIDv7(), ts: Date.now(), channel: "bench.backlog", origin: "bench", type: "t", route: ["bench"], payload: PAYLOAD })));
    }
    await Promise.all(batch);
  }
  await log.close();
  return n;
}

function probe(dir: string, consume: boolean): Record<string, number> {
  const r = Bun.spawnSync([process.execPath, join(import.meta.dir, "fixtures/open-probe.ts"), dir, consume ? "consume" : ""], { stderr: "inherit" });
  if (r.exitCode !== 0) throw new Error(`open probe failed: exit ${r.exitCode}`);
  return JSON.parse(r.stdout.toString().trim().split("\n").pop()!);
}

/** Runs every storage scenario and returns its rows. */
export async function benchStorage(opts: { quick?: boolean } = {}): Promise<Row[]> {
  const secs = opts.quick ? 1 : 3;
  const rows: Row[] = [];
  // The disk of a shared VM drifts: bracket the durable figures with two floor runs and use their mean.
  const f1 = await bareFsync(secs);
  const seq1 = await publishRate("always", 1, secs);
  const f2 = await bareFsync(secs);
  const floor = { syncOpsPerSec: (f1.syncOpsPerSec + f2.syncOpsPerSec) / 2, promiseOpsPerSec: (f1.promiseOpsPerSec + f2.promiseOpsPerSec) / 2 };
  const floorUs = 1e6 / floor.syncOpsPerSec;
  rows.push({
    group: "floor",
    metric: "write+fdatasync (sync calls)",
    value: floor.syncOpsPerSec,
    unit: "ops/s",
    note: `${floorUs.toFixed(0)} µs each (mean of runs before and after: ${f1.syncOpsPerSec.toFixed(0)}, ${f2.syncOpsPerSec.toFixed(0)})`,
  });
  rows.push({ group: "floor", metric: "write+fdatasync (promise datasync)", value: floor.promiseOpsPerSec, unit: "ops/s", note: `${(1e6 / floor.promiseOpsPerSec).toFixed(0)} µs each` });
  for (const sync of ["always", "interval", "none"] as const) {
    for (const workers of [1, 64]) {
      settle();
      const rate = sync === "always" && workers === 1 ? seq1 : await publishRate(sync, workers, secs);
      let note = "";
      if (sync === "always" && workers === 1) note = `${(1e6 / rate).toFixed(0)} µs each = ${(floor.syncOpsPerSec / rate).toFixed(2)}x floor (target <= 1.5x)`;
      if (sync === "always" && workers === 64) note = "target >= 100,000";
      rows.push({ group: `publish sync=${sync}`, metric: `${workers} concurrent`, value: rate, unit: "msg/s", note });
    }
  }
  settle();
  const lat = await handlerLatency(1000, opts.quick ? 2 : 5);
  rows.push({ group: "publish->handler @1000/s", metric: "p50", value: lat.p50, unit: "ms" });
  rows.push({ group: "publish->handler @1000/s", metric: "p99", value: lat.p99, unit: "ms", note: `target < 5 ms; the disk's own fdatasync p99 in this run: ${lat.fsyncP99.toFixed(2)} ms` });
  rows.push({ group: "publish->handler @1000/s", metric: "max", value: lat.max, unit: "ms", note: `${lat.n} samples` });

  const big = root();
  await buildLog(big, { bytes: opts.quick ? 128 * 1024 * 1024 : 1024 * 1024 * 1024 });
  const opened = probe(big, false);
  rows.push({
    group: "open",
    metric: opts.quick ? "open 128 MB log" : "open 1 GB log",
    value: opened.openMs!,
    unit: "ms",
    note: `${opened.messages!.toLocaleString("en-US")} messages; target < 1000 ms`,
  });
  rmSync(big, { recursive: true, force: true });

  const empty = root();
  const e = probe(empty, false);
  const backlogDir = root();
  const count = opts.quick ? 100_000 : 1_000_000;
  await buildLog(backlogDir, { count });
  const b = probe(backlogDir, true);
  rows.push({ group: "rss", metric: "empty log, after open", value: e.rssOpenMB!, unit: "MB" });
  rows.push({ group: "rss", metric: `${count.toLocaleString("en-US")} backlog, after open`, value: b.rssOpenMB!, unit: "MB" });
  rows.push({ group: "rss", metric: `${count.toLocaleString("en-US")} backlog, peak while consuming`, value: b.rssPeakMB!, unit: "MB", note: `consumed in ${(b.consumeMs! / 1000).toFixed(1)} s` });
  rows.push({ group: "rss", metric: `${count.toLocaleString("en-US")} backlog, after consuming`, value: b.rssConsumedMB!, unit: "MB" });
  rmSync(empty, { recursive: true, force: true });
  rmSync(backlogDir, { recursive: true, force: true });
  return rows;
}
