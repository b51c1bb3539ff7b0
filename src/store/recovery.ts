/**
 * Opening a channel's log after a start: its segment files listed in seq
 * order (each bounded by the next one's first seq), and the active segment
 * scanned. Damage with valid records after it is kept (and reported by the
 * log); zeros after the last record are preallocated space (kept); anything
 * else there is a torn tail, cut off and reported with its byte count.
 */
import { mkdir, open, readdir, stat } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "../observability/logger.ts";
import { fsyncDir } from "./fsync-dir.ts";
import { parseSegmentFileName, Segment, segmentFileName } from "./segment.ts";

/** The segments in `dir` (with `create`, the directory and a first empty segment are made). */
export async function listSegments(dir: string, how: { create?: boolean } = {}): Promise<Segment[]> {
  if (how.create) await mkdir(dir, { recursive: true });
  const bases: number[] = [];
  for (const e of await readdir(dir)) {
    const base = parseSegmentFileName(e);
    if (base !== null) bases.push(base);
  }
  bases.sort((a, b) => a - b);
  if (bases.length === 0) {
    const fh = await open(join(dir, segmentFileName(1)), "w+");
    await fh.close();
    await fsyncDir(dir);
    if (how.create) await fsyncDir(join(dir, ".."));
    bases.push(1);
  }
  const segments: Segment[] = [];
  for (let i = 0; i < bases.length; i++) {
    const base = bases[i]!;
    const next = bases[i + 1];
    const st = await stat(join(dir, segmentFileName(base)));
    const lastSeq = next === undefined ? base - 1 : next - 1;
    const seg = new Segment(dir, base, st.size, lastSeq, st.mtimeMs);
    if (next !== undefined) seg.maxSeq = next - 1;
    segments.push(seg);
  }
  return segments;
}

/** Scans the active segment and cuts a torn tail (logged with what was cut). */
export async function recoverActiveSegment(channel: string, active: Segment, logger: Logger): Promise<void> {
  const scan = await active.scan();
  active.allocated = scan.fileBytes;
  if (scan.validBytes === scan.fileBytes) return;
  const fh = await active.handle();
  if (await onlyZeros(fh, scan.validBytes, scan.fileBytes)) return;
  const cut = scan.fileBytes - scan.validBytes;
  await fh.truncate(scan.validBytes);
  await fh.datasync();
  active.allocated = scan.validBytes;
  logger.warn("recovered torn tail", {
    channel,
    segment: active.path,
    reason: scan.stop,
    cut_bytes: cut,
    kept_bytes: scan.validBytes,
    last_seq: scan.lastSeq,
  });
}

/** Whether bytes [from, to) of the file are all zeros (preallocated space). */
async function onlyZeros(fh: { read: (b: Uint8Array, o: number, l: number, p: number) => Promise<{ bytesRead: number }> }, from: number, to: number): Promise<boolean> {
  const buf = new Uint8Array(Math.min(1 << 20, to - from));
  for (let pos = from; pos < to; ) {
    const { bytesRead } = await fh.read(buf, 0, Math.min(buf.length, to - pos), pos);
    if (bytesRead === 0) return true;
    for (let i = 0; i < bytesRead; i++) if (buf[i] !== 0) return false;
    pos += bytesRead;
  }
  return true;
}
