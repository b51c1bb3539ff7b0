/**
 * The record codec: how one envelope sits in a segment file.
 *
 *   offset 0  u32 LE  body length in bytes (1 .. MAX_RECORD_BODY)
 *   offset 4  u32 LE  CRC-32 (IEEE) over bytes 8 .. 16+length (seq and body)
 *   offset 8  u64 LE  sequence number
 *   offset 16 body    msgpack envelope without seq
 *
 * Kept apart from file handling so recovery, readers and federation share
 * one definition of a valid record (docs/storage.md).
 */
import { setU32LE, uninitialized } from "../bytes.ts";

/** Bytes before the body of every record. */
export const RECORD_HEADER_BYTES = 16;
/** Hard upper bound on one body: a larger length field means corruption. */
export const MAX_RECORD_BODY = 16 * 1024 * 1024;

/** A record read back from the log. */
export interface RawRecord {
  seq: number;
  /** The msgpack envelope body (a view; copy it before keeping it long). */
  body: Uint8Array;
}

/**
 * The seq's 8 bytes for the CRC, apart: the CRC of seq and body is the
 * body's CRC continued from the seq's, so no view of `buf` is cut for it
 * (a view of a small new array moves its bytes out of the JavaScript
 * heap first, which cost more than the CRC itself).
 */
const seqBytes = new Uint8Array(8);

/** Writes one record at `offset` of `buf`; returns the offset after it. */
export function writeRecord(buf: Uint8Array, offset: number, seq: number, body: Uint8Array): number {
  const lo = seq % 0x1_0000_0000;
  const hi = Math.floor(seq / 0x1_0000_0000);
  setU32LE(buf, offset, body.length);
  setU32LE(buf, offset + 8, lo);
  setU32LE(buf, offset + 12, hi);
  buf.set(body, offset + RECORD_HEADER_BYTES);
  setU32LE(seqBytes, 0, lo);
  setU32LE(seqBytes, 4, hi);
  setU32LE(buf, offset + 4, Bun.hash.crc32(body, Bun.hash.crc32(seqBytes)));
  return offset + RECORD_HEADER_BYTES + body.length;
}

/**
 * What is written as a record: anything that carries its body (the log's
 * pending appends are written as they are queued, without an array of
 * their bodies made for each write).
 */
export interface Bodied {
  readonly body: Uint8Array;
}

/** Bytes the records of `records` take. */
export function recordsBytes(records: readonly Bodied[]): number {
  let total = 0;
  for (let i = 0; i < records.length; i++) total += RECORD_HEADER_BYTES + records[i]!.body.length;
  return total;
}

/** Writes records with consecutive seqs from `firstSeq` at the start of `buf` (room enough); returns the bytes written. */
export function writeRecords(buf: Uint8Array, firstSeq: number, records: readonly Bodied[]): number {
  let off = 0;
  for (let i = 0; i < records.length; i++) off = writeRecord(buf, off, firstSeq + i, records[i]!.body);
  return off;
}

/** Encodes records with consecutive seqs from `firstSeq` into one buffer of their own. */
export function encodeRecords(firstSeq: number, bodies: readonly Uint8Array[]): Uint8Array {
  const records = bodies.map((body) => ({ body }));
  const buf = uninitialized(recordsBytes(records));
  writeRecords(buf, firstSeq, records);
  return buf;
}

/** Why a scan stopped before the end of the bytes it was given. */
export type ScanStop = "end" | "partial" | "bad_length" | "bad_crc" | "bad_seq";

/** Result of walking a buffer of records. */
export interface ScanResult {
  /** Offset just past the last valid record. */
  end: number;
  /** Seq of the last valid record, or `expectedSeq - 1` when none. */
  lastSeq: number;
  stop: ScanStop;
}

/**
 * Walks records in `buf[start..]`, checking length, CRC and that seqs run on
 * from `expectedSeq`; calls `visit` for each valid one. `partial` means the
 * bytes end inside a record (read more, or a torn tail if this is all).
 */
export function scanRecords(buf: Uint8Array, start: number, expectedSeq: number, visit?: (seq: number, offset: number, bodyStart: number, bodyLen: number) => boolean | undefined): ScanResult {
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  let off = start;
  let seq = expectedSeq;
  while (true) {
    if (off === buf.length) return { end: off, lastSeq: seq - 1, stop: "end" };
    if (off + RECORD_HEADER_BYTES > buf.length) return { end: off, lastSeq: seq - 1, stop: "partial" };
    const len = view.getUint32(off, true);
    if (len === 0 || len > MAX_RECORD_BODY) return { end: off, lastSeq: seq - 1, stop: "bad_length" };
    const end = off + RECORD_HEADER_BYTES + len;
    if (end > buf.length) return { end: off, lastSeq: seq - 1, stop: "partial" };
    if (view.getUint32(off + 4, true) !== Bun.hash.crc32(buf.subarray(off + 8, end))) {
      return { end: off, lastSeq: seq - 1, stop: "bad_crc" };
    }
    const s = view.getUint32(off + 8, true) + view.getUint32(off + 12, true) * 0x1_0000_0000;
    if (s !== seq) return { end: off, lastSeq: seq - 1, stop: "bad_seq" };
    if (visit && visit(seq, off, off + RECORD_HEADER_BYTES, len) === false) {
      return { end, lastSeq: seq, stop: "end" };
    }
    off = end;
    seq++;
  }
}

/** Where a resynchronising search found a valid record. */
export interface FoundRecord {
  offset: number;
  seq: number;
}

/** A file that can be read at a position (a FileHandle, or a test's fake). */
export interface PositionalReader {
  read(buf: Uint8Array, offset: number, length: number, position: number): Promise<{ bytesRead: number }>;
}

const SEARCH_CHUNK = 1 << 20;

/**
 * Searches bytes [from, end) of a file for the first offset holding a whole
 * valid record (length in range, CRC matching) whose seq lies in
 * [minSeq, maxSeq]: where the records go on after damage. Null when none
 * does, which makes everything from `from` a torn tail.
 */
export async function findNextRecord(file: PositionalReader, from: number, end: number, minSeq: number, maxSeq: number): Promise<FoundRecord | null> {
  // A record takes at least RECORD_HEADER_BYTES + 1 bytes, so no valid seq can lie further ahead.
  const seqBound = Math.min(maxSeq, minSeq + Math.ceil((end - from) / (RECORD_HEADER_BYTES + 1)));
  const buf = new Uint8Array(Math.min(SEARCH_CHUNK + RECORD_HEADER_BYTES, Math.max(end - from, 0)));
  for (let base = from; base + RECORD_HEADER_BYTES <= end; base += SEARCH_CHUNK) {
    const want = Math.min(buf.length, end - base);
    const { bytesRead } = await file.read(buf, 0, want, base);
    const view = new DataView(buf.buffer, buf.byteOffset, bytesRead);
    const last = Math.min(bytesRead - RECORD_HEADER_BYTES, SEARCH_CHUNK - 1);
    for (let p = 0; p <= last; p++) {
      const len = view.getUint32(p, true);
      if (len === 0 || len > MAX_RECORD_BODY || base + p + RECORD_HEADER_BYTES + len > end) continue;
      const hi = view.getUint32(p + 12, true);
      const seq = view.getUint32(p + 8, true) + hi * 0x1_0000_0000;
      if (seq < minSeq || seq > seqBound) continue;
      const crc = view.getUint32(p + 4, true);
      let body: Uint8Array;
      if (p + RECORD_HEADER_BYTES + len <= bytesRead) body = buf.subarray(p + 8, p + RECORD_HEADER_BYTES + len);
      else {
        body = new Uint8Array(len + 8);
        const got = await file.read(body, 0, body.length, base + p + 8);
        if (got.bytesRead < body.length) continue;
      }
      if (Bun.hash.crc32(body) === crc) return { offset: base + p, seq };
    }
  }
  return null;
}
