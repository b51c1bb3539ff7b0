/**
 * One segment file of a channel: `<first seq, 20 digits>.log`.
 *
 * A segment knows its committed size and last seq, and keeps a sparse index
 * (one entry per INDEX_INTERVAL bytes) so that a read from any seq scans at
 * most a few KiB. Sealed segments are indexed on first read, not at open,
 * which is what keeps opening a large log fast.
 */
import { open, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { findNextRecord, RECORD_HEADER_BYTES, scanRecords, type RawRecord, type ScanStop } from "./record.ts";

/** Bytes between sparse index entries. */
export const INDEX_INTERVAL = 4096;
/** Bytes read at a time when scanning or reading. */
const READ_CHUNK = 256 * 1024;
const SEGMENT_RE = /^(\d{20})\.log$/;

/** File name of the segment whose first record has `baseSeq`. */
export function segmentFileName(baseSeq: number): string {
  return `${String(baseSeq).padStart(20, "0")}.log`;
}

/** The base seq encoded in a segment file name, or null for other files. */
export function parseSegmentFileName(name: string): number | null {
  const m = SEGMENT_RE.exec(name);
  return m ? Number(m[1]) : null;
}

/** What a full scan of a segment found. */
export interface SegmentScan {
  /** Bytes from the start of the file to the end of the last valid record. */
  validBytes: number;
  fileBytes: number;
  lastSeq: number;
  /** Why the records ended before the end of the file ("end" when they did not). */
  stop: ScanStop;
  /** Damaged stretches with valid records after them (kept, skipped by reads). */
  damage: Damage[];
}

/**
 * A stretch of a segment that holds no valid record, with valid records
 * after it: corruption in the middle, not a torn tail. Reads skip it; the
 * records it held (seqs `firstSeq..lastSeq`) are gone.
 */
export interface Damage {
  segment: string;
  /** Byte offset where the damage starts, and how many bytes it spans (0: only seqs are missing). */
  offset: number;
  bytes: number;
  firstSeq: number;
  lastSeq: number;
  /** What was found at `offset`. */
  reason: ScanStop;
}

/** A segment file with its committed extent and sparse index. */
export class Segment {
  readonly baseSeq: number;
  readonly path: string;
  /** Bytes of committed records (anything past it is not visible). */
  size: number;
  /** Seq of the last committed record (baseSeq - 1 when empty). */
  lastSeq: number;
  /** Last time a record was appended (ms), for age-based retention. */
  lastWriteMs: number;
  /**
   * File size on disk: committed records plus preallocated zeros after them
   * (active segment only; sealed segments are cut to `size`).
   */
  allocated: number;
  /** False until the sparse index covers the whole committed extent. */
  indexed = false;
  /**
   * Highest seq this segment may hold: a sealed segment ends where the next
   * one begins, and records past that (left by a cut that did not reach the
   * disk before a crash) are copies the next segment holds.
   */
  maxSeq = Number.MAX_SAFE_INTEGER;
  /** Damaged stretches found by the last scan, in file order. */
  damage: Damage[] = [];
  /** Called for each damaged stretch a scan finds (logs and counters). */
  onDamage: ((d: Damage) => void) | null = null;
  private idxSeq: number[] = [];
  private idxOff: number[] = [];
  private nextIndexOff = 0;
  private fh: FileHandle | null = null;
  private opening: Promise<FileHandle> | null = null;
  private busy = 0;
  private closeWhenIdle = false;
  private freeSync: FileHandle[] = [];
  private lentSync = new Set<FileHandle>();

  constructor(dir: string, baseSeq: number, size: number, lastSeq: number, lastWriteMs: number) {
    this.baseSeq = baseSeq;
    this.path = join(dir, segmentFileName(baseSeq));
    this.size = size;
    this.lastSeq = lastSeq;
    this.lastWriteMs = lastWriteMs;
    this.allocated = size;
  }

  /** Number of committed records. */
  get count(): number {
    return this.lastSeq - this.baseSeq + 1;
  }

  /** Notes a record written at `offset`; keeps the sparse index current. */
  noteAppended(seq: number, offset: number): void {
    if (offset >= this.nextIndexOff) {
      this.idxSeq.push(seq);
      this.idxOff.push(offset);
      this.nextIndexOff = offset + INDEX_INTERVAL;
    }
  }

  /**
   * Scans the whole file, checking every record, and rebuilds the index.
   * Used for the active segment at open (to find a torn tail) and for sealed
   * segments on first read. A bad stretch followed by valid records is
   * damage, kept and reported; only a bad stretch with nothing valid after
   * it ends the records (a torn tail).
   */
  async scan(): Promise<SegmentScan> {
    const fh = await this.handle();
    const fileBytes = (await fh.stat()).size;
    this.idxSeq = [];
    this.idxOff = [];
    this.nextIndexOff = 0;
    this.damage = [];
    let pos = 0;
    let seq = this.baseSeq;
    let buf = new Uint8Array(Math.min(READ_CHUNK * 16, Math.max(fileBytes, RECORD_HEADER_BYTES)));
    let stop: ScanStop = "end";
    const maxSeq = this.maxSeq;
    const visit = (s: number, off: number) => {
      if (s > maxSeq) return false;
      this.noteAppended(s, off);
    };
    while (pos < fileBytes) {
      const chunkStart = pos;
      const want = Math.min(buf.length, fileBytes - pos);
      const { bytesRead } = await fh.read(buf, 0, want, pos);
      const chunk = buf.subarray(0, bytesRead);
      const r = scanRecords(chunk, 0, seq, (s, off) => visit(s, chunkStart + off));
      pos += r.end;
      seq = r.lastSeq + 1;
      if (seq > maxSeq) break;
      const moreInFile = chunkStart + bytesRead < fileBytes;
      if (r.stop === "end" && bytesRead > 0) continue;
      if (r.stop === "partial" && moreInFile) {
        // A record crosses the chunk edge: read on from its start, with room for all of it.
        const rest = chunk.subarray(r.end);
        const need = rest.length >= 4 ? new DataView(rest.buffer, rest.byteOffset).getUint32(0, true) + RECORD_HEADER_BYTES : RECORD_HEADER_BYTES;
        if (need <= buf.length) continue;
        if (need <= fileBytes - pos) {
          buf = new Uint8Array(need);
          continue;
        }
      }
      // Not a clean end: damage in the middle if a valid record follows, else the tail.
      const found = await findNextRecord(fh, pos, fileBytes, seq, maxSeq);
      if (!found) {
        stop = r.stop === "end" ? "partial" : r.stop;
        break;
      }
      const d: Damage = { segment: this.path, offset: pos, bytes: found.offset - pos, firstSeq: seq, lastSeq: found.seq - 1, reason: r.stop === "end" ? "partial" : r.stop };
      this.damage.push(d);
      this.onDamage?.(d);
      pos = found.offset;
      seq = found.seq;
    }
    this.lastSeq = seq - 1;
    this.size = pos;
    this.indexed = true;
    return { validBytes: pos, fileBytes, lastSeq: seq - 1, stop: pos === fileBytes ? "end" : stop, damage: this.damage };
  }

  /**
   * Reads committed records with seq >= `fromSeq`, at most `maxCount` and
   * about `maxBytes` (always at least one). Returns [] past the end.
   */
  async read(fromSeq: number, maxCount: number, maxBytes: number): Promise<RawRecord[]> {
    if (fromSeq > this.lastSeq || maxCount <= 0) return [];
    this.busy++;
    try {
      if (!this.indexed) await this.scan();
      const out: RawRecord[] = [];
      let [seq, pos] = this.locate(fromSeq);
      let bytes = 0;
      let chunkSize = Math.min(READ_CHUNK, Math.max(maxCount, 4) * 1024 + INDEX_INTERVAL);
      const fh = await this.handle();
      while (pos < this.size && out.length < maxCount && bytes < maxBytes) {
        const want = Math.min(chunkSize, this.size - pos);
        const buf = new Uint8Array(want);
        const { bytesRead } = await fh.read(buf, 0, want, pos);
        const chunk = buf.subarray(0, bytesRead);
        const last = this.lastSeq;
        const r = scanRecords(chunk, 0, seq, (s, _off, bodyStart, bodyLen) => {
          if (s > last) return false;
          if (s < fromSeq) return true;
          out.push({ seq: s, body: chunk.subarray(bodyStart, bodyStart + bodyLen) });
          bytes += bodyLen + RECORD_HEADER_BYTES;
          return out.length < maxCount && bytes < maxBytes;
        });
        pos += r.end;
        seq = r.lastSeq + 1;
        if (seq > last) break;
        if (r.stop === "end" || (r.stop === "partial" && r.end > 0)) continue;
        if (r.stop === "partial" && want < this.size - pos) {
          chunkSize = Math.min(this.size - pos, chunkSize * 4);
          continue;
        }
        // Known damage is stepped over; anything else inside the committed extent ends the read.
        const d = this.damage.find((x) => x.offset === pos);
        if (!d) break;
        pos = d.offset + d.bytes;
        seq = d.lastSeq + 1;
      }
      return out;
    } finally {
      this.busy--;
      if (this.busy === 0 && this.closeWhenIdle) await this.closeNow();
    }
  }

  /**
   * Bytes of the records with seq >= `seq` in this segment, without I/O:
   * from the sparse index it is exact to within one index interval (4 KiB,
   * counted in); for a sealed segment not yet read since start (no index)
   * it is the share of the records times the segment's size.
   */
  bytesFrom(seq: number): number {
    if (seq > this.lastSeq || this.size === 0) return 0;
    if (seq <= this.baseSeq) return this.size;
    if (this.idxSeq.length > 0) return this.size - this.locate(seq)[1];
    return Math.round((this.size * (this.lastSeq - seq + 1)) / this.count);
  }

  /** Index entry at or before `seq`: [seq, offset] to start scanning from. */
  private locate(seq: number): [number, number] {
    const s = this.idxSeq;
    let lo = 0;
    let hi = s.length - 1;
    let best = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (s[mid]! <= seq) {
        best = mid;
        lo = mid + 1;
      } else hi = mid - 1;
    }
    return best < 0 ? [this.baseSeq, 0] : [s[best]!, this.idxOff[best]!];
  }

  /** The file handle, opened read-write on first use. */
  async handle(): Promise<FileHandle> {
    if (this.fh) return this.fh;
    this.opening ??= open(this.path, "r+").then((fh) => (this.fh = fh));
    try {
      return await this.opening;
    } finally {
      this.opening = null;
    }
  }

  /**
   * A handle of its own for one fdatasync. A write-back error is reported
   * once per open file, to whichever fdatasync on it asks first: two
   * fdatasyncs in flight on one handle can each take the other's error, so
   * that the one whose bytes were lost reports success. A handle per
   * fdatasync in flight gets every error to each of them.
   */
  async syncHandle(): Promise<FileHandle> {
    const fh = this.freeSync.pop() ?? (await open(this.path, "r+"));
    this.lentSync.add(fh);
    return fh;
  }

  /** A handle for an fdatasync from the free ones, lent like `syncHandle`'s; null when none is free. */
  syncHandleNow(): FileHandle | null {
    const fh = this.freeSync.pop();
    if (fh) this.lentSync.add(fh);
    return fh ?? null;
  }

  /** Gives back a handle from `syncHandle` once its fdatasync is done. */
  releaseSyncHandle(fh: FileHandle): void {
    if (this.lentSync.delete(fh)) this.freeSync.push(fh);
    // Lent before the segment was closed or reopened: retire it. Its fdatasync is done and was
    // acted on, so a close error loses nothing.
    else void fh.close().catch(() => {});
  }

  /**
   * Closes every handle, so that nothing opened before a write-back error
   * is used after it: the next use opens afresh.
   */
  async reopen(): Promise<void> {
    await this.closeNow();
  }

  /**
   * Forgets everything from byte `offset` on (the file was cut there): the
   * committed extent, index entries and damage past it.
   */
  cutAt(offset: number, lastSeq: number): void {
    this.size = offset;
    this.allocated = offset;
    this.lastSeq = lastSeq;
    let n = this.idxOff.length;
    while (n > 0 && this.idxOff[n - 1]! >= offset) n--;
    this.idxOff.length = n;
    this.idxSeq.length = n;
    this.nextIndexOff = n > 0 ? this.idxOff[n - 1]! + INDEX_INTERVAL : 0;
    this.damage = this.damage.filter((d) => d.offset < offset);
  }

  /** The already-open handle, if any (the writer keeps the active one open). */
  get openHandle(): FileHandle | null {
    return this.fh;
  }

  /** Adopts a freshly created handle (new active segment). */
  adopt(fh: FileHandle): void {
    this.fh = fh;
    this.indexed = true;
  }

  /** Closes the handle now, or once in-flight reads finish. */
  async close(): Promise<void> {
    if (this.busy > 0) {
      this.closeWhenIdle = true;
      return;
    }
    await this.closeNow();
  }

  private async closeNow(): Promise<void> {
    this.closeWhenIdle = false;
    const fh = this.fh;
    this.fh = null;
    const sync = this.freeSync;
    this.freeSync = [];
    this.lentSync = new Set();
    // A close error loses nothing here: every write through these handles was followed by an
    // fdatasync whose result was acted on, and the file is reopened for anything that follows.
    for (const h of fh ? [fh, ...sync] : sync) await h.close().catch(() => {});
  }
}
