/** Reading segment files from outside the agent: ranges, a torn tail, preallocated zeros, damage, records larger than a read. */
import { describe, expect, test } from "bun:test";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { readLogRecords, type ReadReport } from "../../src/store/log-reader.ts";
import { encodeRecords } from "../../src/store/record.ts";
import { segmentFileName } from "../../src/store/segment.ts";
import { tmpDir } from "../helpers.ts";

const body = (n: number, size = 8) => new Uint8Array(size).fill(n % 251);

async function read(dir: string, range: { from?: number; to?: number } = {}) {
  const report: ReadReport = { damaged: 0, damagedBytes: 0 };
  const out: { seq: number; len: number }[] = [];
  for await (const r of readLogRecords(dir, range, report)) out.push({ seq: r.seq, len: r.body.length });
  return { seqs: out.map((r) => r.seq), lens: out.map((r) => r.len), report };
}

describe("readLogRecords", () => {
  test("records of every segment in order, bounded by seq; a segment outside the range is not read", async () => {
    const dir = tmpDir();
    writeFileSync(
      join(dir, segmentFileName(1)),
      encodeRecords(
        1,
        [1, 2, 3].map((n) => body(n)),
      ),
    );
    writeFileSync(
      join(dir, segmentFileName(4)),
      encodeRecords(
        4,
        [4, 5].map((n) => body(n)),
      ),
    );
    writeFileSync(join(dir, "not-a-segment.tmp"), "x");
    expect((await read(dir)).seqs).toEqual([1, 2, 3, 4, 5]);
    expect((await read(dir, { from: 3, to: 4 })).seqs).toEqual([3, 4]);
    expect((await read(dir, { from: 5 })).seqs).toEqual([5]);
    expect((await read(join(dir, "missing"))).seqs).toEqual([]);
  });

  test("preallocated zeros and a record still being written end the read; damage in the middle is skipped and counted", async () => {
    const dir = tmpDir();
    const recs = encodeRecords(
      1,
      [1, 2, 3, 4].map((n) => body(n)),
    );
    const torn = encodeRecords(5, [body(5)]).subarray(0, 10);
    const zeros = new Uint8Array(4096);
    writeFileSync(join(dir, segmentFileName(1)), Buffer.concat([recs, torn]));
    expect((await read(dir)).seqs).toEqual([1, 2, 3, 4]);
    writeFileSync(join(dir, segmentFileName(1)), Buffer.concat([recs, zeros]));
    expect((await read(dir)).seqs).toEqual([1, 2, 3, 4]);
    const damaged = Buffer.from(recs);
    damaged[24 + 20] = damaged[24 + 20]! ^ 0xff; // inside record 2's body: its CRC fails
    writeFileSync(join(dir, segmentFileName(1)), damaged);
    const r = await read(dir);
    expect(r.seqs).toEqual([1, 3, 4]);
    expect(r.report.damaged).toBe(1);
  });

  test("a record larger than one read (4 MiB) is read whole", async () => {
    const dir = tmpDir();
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, segmentFileName(1)), encodeRecords(1, [body(1), body(2, 5 * 1024 * 1024), body(3)]));
    const r = await read(dir);
    expect(r.seqs).toEqual([1, 2, 3]);
    expect(r.lens).toEqual([8, 5 * 1024 * 1024, 8]);
  });
});
