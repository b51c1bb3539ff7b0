/**
 * `Messenger.publishBatch` inside one process: batches of 1,000 JSON
 * messages over two channels (what `POST /v1/publish` with NDJSON hands
 * it), `sync: always`, CPU per message (process.cpuUsage, all threads). For
 * A/B of the batch path without HTTP, run against two work trees in turn:
 *
 *   bun bench/batch-path.ts [--tree=<work tree>] [--batches=200] [--segments=5]
 *
 * One JSON line: each segment's CPU per message, and their median.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { arg } from "./lib.ts";

const tree = resolve(arg("tree", "."));
const batches = Number(arg("batches", "200"));
const segments = Number(arg("segments", "5"));
const { Messenger } = (await import(join(tree, "src", "index.ts"))) as typeof import("../src/index.ts");
const dir = mkdtempSync(join(tmpdir(), "keyop-batch-path-"));
const m = await Messenger.open({ name: "b", storage: { dataDir: dir, sync: "always" } });
const PAD = "x".repeat(200);
const entries = Array.from({ length: 1000 }, (_, i) => ({ channel: i % 2 ? "a.x" : "a.y", type: "t", payload: { i, pad: PAD } }));
try {
  // Warm-up: the JIT, the segments' first fills.
  for (let i = 0; i < 300; i++) await m.publishBatch(entries);
  const us: number[] = [];
  for (let s = 0; s < segments; s++) {
    const c0 = process.cpuUsage();
    for (let i = 0; i < batches; i++) await m.publishBatch(entries);
    const c = process.cpuUsage(c0);
    us.push(Math.round(((c.user + c.system) / (batches * entries.length)) * 100) / 100);
  }
  const sorted = [...us].sort((a, b) => a - b);
  console.log(JSON.stringify({ workload: "publishBatch of 1,000 over two channels, sync always", tree, cpuUsPerMsg: sorted[(sorted.length - 1) >> 1], segmentsCpuUsPerMsg: us }));
} finally {
  await m.close();
  rmSync(dir, { recursive: true, force: true });
}
