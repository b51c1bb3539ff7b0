/**
 * Reading a channel's segment files from outside the agent (`keyop
 * export`): read-only, without the data directory's lock, so it works with
 * the agent running or stopped and changes nothing (no segment is created,
 * no cursor moves). Records are checked as recovery checks them; a damaged
 * stretch is skipped to the next valid record and counted, and a record
 * being written at the end of the active segment (or its preallocated
 * zeros) ends the read.
 */
import { type FileHandle, open, readdir } from "node:fs/promises";
import { join } from "node:path";
import { findNextRecord, MAX_RECORD_BODY, RECORD_HEADER_BYTES, scanRecords } from "./record.ts";
import { parseSegmentFileName } from "./segment.ts";

/** Bytes read from a segment at a time. */
const CHUNK = 4 * 1024 * 1024;

/** What a read found besides the records. */
export interface ReadReport {
  /** Damaged stretches skipped. */
  damaged: number;
  /** Bytes in them. */
  damagedBytes: number;
}

/** The base seqs of the segment files in `dir`, in order; [] when there is no such directory. */
export async function segmentBases(dir: string): Promise<number[]> {
  let names: string[];
  try {
    names = await readdir(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw err;
  }
  const bases: number[] = [];
  for (const n of names) {
    const b = parseSegmentFileName(n);
    if (b !== null) bases.push(b);
  }
  return bases.sort((a, b) => a - b);
}

/**
 * The records of the channel log in `dir` with seq in [from, to], in order.
 * `report` is filled in as the read goes.
 */
export async function* readLogRecords(
  dir: string,
  range: { from?: number; to?: number } = {},
  report: ReadReport = { damaged: 0, damagedBytes: 0 },
): AsyncGenerator<{ seq: number; body: Uint8Array }> {
  const from = range.from ?? 0;
  const to = range.to ?? Number.MAX_SAFE_INTEGER;
  const bases = await segmentBases(dir);
  for (let i = 0; i < bases.length; i++) {
    const base = bases[i]!;
    const next = bases[i + 1];
    // A segment ends where the next begins; segments wholly outside the range are not opened.
    const last = next === undefined ? Number.MAX_SAFE_INTEGER : next - 1;
    if (last < from) continue;
    if (base > to) return;
    yield* readSegment(join(dir, `${String(base).padStart(20, "0")}.log`), base, Math.min(last, to), from, report);
  }
}

async function* readSegment(path: string, base: number, maxSeq: number, from: number, report: ReadReport): AsyncGenerator<{ seq: number; body: Uint8Array }> {
  let fh: FileHandle;
  try {
    fh = await open(path, "r");
  } catch (err) {
    // Removed by retention since the listing: nothing left to read in it.
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return;
    throw err;
  }
  try {
    const size = (await fh.stat()).size;
    let pos = 0;
    let seq = base;
    let buf = new Uint8Array(Math.min(CHUNK, Math.max(size, RECORD_HEADER_BYTES)));
    while (pos < size && seq <= maxSeq) {
      const want = Math.min(buf.length, size - pos);
      const { bytesRead } = await fh.read(buf, 0, want, pos);
      const chunk = buf.subarray(0, bytesRead);
      const out: { seq: number; body: Uint8Array }[] = [];
      const r = scanRecords(chunk, 0, seq, (s, _off, start, len) => {
        if (s > maxSeq) return false;
        if (s >= from) out.push({ seq: s, body: chunk.slice(start, start + len) });
      });
      for (const x of out) yield x;
      if (r.lastSeq >= maxSeq) return;
      pos += r.end;
      seq = r.lastSeq + 1;
      if (r.stop === "end") continue;
      if (r.stop === "partial") {
        if (pos + bytesRead - r.end >= size || bytesRead < want) return; // a record still being written
        if (r.end === 0) {
          // One record larger than the buffer: read it whole.
          const len = new DataView(chunk.buffer, chunk.byteOffset).getUint32(0, true);
          if (len > MAX_RECORD_BODY) return;
          buf = new Uint8Array(RECORD_HEADER_BYTES + len);
        }
        continue;
      }
      // Nothing valid after it (the active segment's preallocated zeros, a torn tail): the end.
      // Otherwise damage: on at the next valid record, as the agent's own reads go on.
      const found = await findNextRecord(fh, pos, size, seq, maxSeq);
      if (!found) return;
      report.damaged++;
      report.damagedBytes += found.offset - pos;
      pos = found.offset;
      seq = found.seq;
    }
  } finally {
    await fh.close();
  }
}
