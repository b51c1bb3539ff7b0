/**
 * The append-only log of one channel: a directory of segments.
 *
 * Appends are gathered by group commit: every append that arrives while a
 * write + fdatasync is in flight goes into the next single write and single
 * fdatasync, which runs on the thread pool (promise API) so the event loop
 * keeps gathering. A record becomes visible to readers only once it is as
 * durable as the sync mode promises, so no reader ever sees a record that a
 * crash could take back under `sync: always`.
 */
import { mkdir, open, readdir, stat, unlink, type FileHandle } from "node:fs/promises";
import { ftruncateSync, writeSync } from "node:fs";
import { join } from "node:path";
import { ClosedError, ioErrorFrom, TooLargeError } from "../errors.ts";
import type { Logger } from "../observability/logger.ts";
import { encodeRecords, MAX_RECORD_BODY, RECORD_HEADER_BYTES, type RawRecord } from "./record.ts";
import { parseSegmentFileName, Segment, segmentFileName } from "./segment.ts";
import { fsyncDir } from "./fsync-dir.ts";

/** How far an acknowledged append is from the platter. */
export type SyncMode = "always" | "interval" | "none";

/** Tuning of one channel log. */
export interface ChannelLogOptions {
  segmentBytes: number;
  sync: SyncMode;
  syncIntervalMs: number;
  /** Bytes of recent records kept in memory for readers that keep up. */
  tailCacheBytes: number;
  logger: Logger;
  /** Called with the fdatasync duration in ms (metrics). */
  onFsync?: (ms: number) => void;
}

/** What retention may remove and what it must keep. */
export interface RetentionPolicy {
  /** Sealed segments whose last write is older than this may go (ms). */
  maxAgeMs?: number | undefined;
  /** Above this many bytes the oldest sealed segments go, cursors or not. */
  maxBytes?: number | undefined;
  /** Lowest seq a cursor still needs (age-based removal keeps it). */
  pinnedSeq: number;
}

/** What one retention pass did. */
export interface RetentionResult {
  removedSegments: number;
  removedRecords: number;
  removedBytes: number;
  firstSeq: number;
}

interface Pending {
  body: Uint8Array;
  /** performance.now() when the append was requested. */
  at: number;
  resolve: (seq: number) => void;
  reject: (err: unknown) => void;
}

interface Cached extends RawRecord {
  /** performance.now() when the append was requested (latency metrics). */
  at: number;
}

/** Commit listener: called after records [firstSeq, nextSeq) became visible. */
export type CommitListener = (firstSeq: number, nextSeq: number) => void;

/** The log of one channel. Create with `ChannelLog.open`. */
export class ChannelLog {
  readonly name: string;
  readonly dir: string;
  private readonly opts: ChannelLogOptions;
  private segments: Segment[];
  private queue: Pending[] = [];
  private flushing: Promise<void> | null = null;
  private closed = false;
  private dirty = false;
  private syncTimer: ReturnType<typeof setInterval> | null = null;
  private listeners = new Set<CommitListener>();
  private tail: Cached[] = [];
  private tailHead = 0;
  private tailBytes = 0;
  /** Seq the next appended record gets. */
  nextSeq: number;

  private constructor(name: string, dir: string, opts: ChannelLogOptions, segments: Segment[], nextSeq: number) {
    this.name = name;
    this.dir = dir;
    this.opts = opts;
    this.segments = segments;
    this.nextSeq = nextSeq;
    if (opts.sync === "interval") {
      this.syncTimer = setInterval(() => void this.syncNow().catch(() => {}), opts.syncIntervalMs);
      this.syncTimer.unref?.();
    }
  }

  /**
   * Opens (or with `create`, creates) the log in `dir`. The active segment is
   * scanned and a torn or corrupt tail is cut at the last good record; sealed
   * segments are only listed.
   */
  static async open(name: string, dir: string, opts: ChannelLogOptions, create = false): Promise<ChannelLog> {
    if (create) await mkdir(dir, { recursive: true });
    const entries = await readdir(dir);
    const bases: number[] = [];
    for (const e of entries) {
      const base = parseSegmentFileName(e);
      if (base !== null) bases.push(base);
      else if (e.endsWith(".tmp")) await unlink(join(dir, e)).catch(() => {});
    }
    bases.sort((a, b) => a - b);
    if (bases.length === 0) {
      const fh = await open(join(dir, segmentFileName(1)), "w+");
      await fh.close();
      await fsyncDir(dir);
      if (create) await fsyncDir(join(dir, ".."));
      bases.push(1);
    }
    const segments: Segment[] = [];
    for (let i = 0; i < bases.length; i++) {
      const base = bases[i]!;
      const next = bases[i + 1];
      const st = await stat(join(dir, segmentFileName(base)));
      const lastSeq = next === undefined ? base - 1 : next - 1;
      segments.push(new Segment(dir, base, st.size, lastSeq, st.mtimeMs));
    }
    const active = segments[segments.length - 1]!;
    try {
      await ChannelLog.recoverTail(name, active, opts);
    } catch (err) {
      await active.close();
      throw err;
    }
    return new ChannelLog(name, dir, opts, segments, active.lastSeq + 1);
  }

  /** Scans the active segment and cuts a torn or corrupt tail, saying so. */
  private static async recoverTail(name: string, active: Segment, opts: ChannelLogOptions): Promise<void> {
    const scan = await active.scan();
    if (scan.validBytes < scan.fileBytes) {
      const cut = scan.fileBytes - scan.validBytes;
      const fh = await active.handle();
      await fh.truncate(scan.validBytes);
      await fh.datasync();
      opts.logger.warn("recovered torn tail", {
        channel: name,
        segment: active.path,
        reason: scan.stop,
        cut_bytes: cut,
        kept_bytes: scan.validBytes,
        last_seq: scan.lastSeq,
      });
    }
  }

  /** Seq of the oldest record still stored (== nextSeq when empty). */
  get firstSeq(): number {
    // An empty log has one empty segment whose base is nextSeq.
    return this.segments[0]!.baseSeq;
  }

  /** Bytes of committed records across all segments. */
  get bytes(): number {
    let total = 0;
    for (const s of this.segments) total += s.size;
    return total;
  }

  /** Number of segment files. */
  get segmentCount(): number {
    return this.segments.length;
  }

  /** Appends one encoded envelope; resolves with its seq once durable. */
  append(body: Uint8Array): Promise<number> {
    if (this.closed) return Promise.reject(new ClosedError(`channel ${this.name} is closed`));
    if (body.length === 0 || body.length > MAX_RECORD_BODY) {
      return Promise.reject(new TooLargeError(`record of ${body.length} bytes is outside 1..${MAX_RECORD_BODY}`));
    }
    return new Promise<number>((resolve, reject) => {
      this.queue.push({ body, at: performance.now(), resolve, reject });
      this.flushing ??= this.flushLoop();
    });
  }

  /** Appends several bodies in one group commit; resolves with their seqs. */
  appendMany(bodies: readonly Uint8Array[]): Promise<number[]> {
    return Promise.all(bodies.map((b) => this.append(b)));
  }

  /**
   * performance.now() of the append request of a recent record, for
   * publish-to-handler latency; undefined once it left the tail cache.
   */
  appendedAt(seq: number): number | undefined {
    const n = this.tail.length - this.tailHead;
    if (n === 0) return undefined;
    const first = this.tail[this.tailHead]!.seq;
    if (seq < first || seq >= first + n) return undefined;
    return this.tail[this.tailHead + (seq - first)]!.at;
  }

  private async flushLoop(): Promise<void> {
    // Let every append made in this tick join the first batch.
    await Promise.resolve();
    try {
      while (this.queue.length > 0) {
        const batch = this.queue;
        this.queue = [];
        await this.writeBatch(batch);
        // Let the publishers we just resolved queue their next appends first.
        await new Promise<void>((r) => setImmediate(r));
      }
    } finally {
      this.flushing = null;
    }
  }

  private async writeBatch(batch: Pending[]): Promise<void> {
    let i = 0;
    try {
      while (i < batch.length) {
        let seg = this.segments[this.segments.length - 1]!;
        const first = batch[i]!.body.length + RECORD_HEADER_BYTES;
        if (seg.size > 0 && seg.size + first > this.opts.segmentBytes) seg = await this.roll();
        let room = this.opts.segmentBytes - seg.size;
        let j = i;
        do {
          room -= batch[j]!.body.length + RECORD_HEADER_BYTES;
          j++;
        } while (j < batch.length && room >= batch[j]!.body.length + RECORD_HEADER_BYTES);
        const chunk = i === 0 && j === batch.length ? batch : batch.slice(i, j);
        const firstSeq = await this.writeChunk(seg, chunk);
        for (let k = 0; k < chunk.length; k++) chunk[k]!.resolve(firstSeq + k);
        i = j;
      }
    } catch (err) {
      const e = ioErrorFrom(err, `append to channel ${this.name}`);
      this.opts.logger.error("append failed", { channel: this.name, code: e.code, error: e.message, rejected: batch.length - i });
      for (; i < batch.length; i++) batch[i]!.reject(e);
    }
  }

  /** One write (+ fdatasync) of consecutive records into `seg`, then commit; returns the first seq. */
  private async writeChunk(seg: Segment, chunk: Pending[]): Promise<number> {
    const firstSeq = this.nextSeq;
    const bodies = chunk.map((p) => p.body);
    const buf = encodeRecords(firstSeq, bodies);
    const fh = await seg.handle();
    const pos = seg.size;
    try {
      let done = 0;
      while (done < buf.length) done += writeSync(fh.fd, buf, done, buf.length - done, pos + done);
      if (this.opts.sync === "always") {
        const t = performance.now();
        await fh.datasync();
        this.opts.onFsync?.(performance.now() - t);
      } else this.dirty = true;
    } catch (err) {
      // Nothing partial may stay behind: cut the file back to the committed size.
      try {
        ftruncateSync(fh.fd, pos);
      } catch (truncErr) {
        this.opts.logger.error("could not cut back a failed write", { channel: this.name, error: String(truncErr) });
      }
      throw err;
    }
    let off = pos;
    const cache = this.opts.tailCacheBytes > 0;
    for (let k = 0; k < bodies.length; k++) {
      const seq = firstSeq + k;
      seg.noteAppended(seq, off);
      const len = bodies[k]!.length;
      if (cache) {
        const start = off - pos + RECORD_HEADER_BYTES;
        this.pushTail({ seq, body: buf.subarray(start, start + len), at: chunk[k]!.at });
      }
      off += RECORD_HEADER_BYTES + len;
    }
    seg.size = off;
    seg.lastSeq = firstSeq + bodies.length - 1;
    seg.lastWriteMs = Date.now();
    this.nextSeq = firstSeq + bodies.length;
    for (const l of this.listeners) {
      try {
        l(firstSeq, this.nextSeq);
      } catch (err) {
        this.opts.logger.error("commit listener failed", { channel: this.name, error: String(err) });
      }
    }
    return firstSeq;
  }

  /** Seals the active segment and starts a new one at nextSeq. */
  private async roll(): Promise<Segment> {
    const old = this.segments[this.segments.length - 1]!;
    const oldFh = await old.handle();
    if (this.opts.sync !== "none") await oldFh.datasync();
    const seg = new Segment(this.dir, this.nextSeq, 0, this.nextSeq - 1, Date.now());
    const fh: FileHandle = await open(seg.path, "w+");
    seg.adopt(fh);
    if (this.opts.sync !== "none") await fsyncDir(this.dir);
    this.segments.push(seg);
    await old.close();
    this.opts.logger.debug("segment rolled", { channel: this.name, sealed: old.path, next_seq: this.nextSeq });
    return seg;
  }

  private pushTail(rec: Cached): void {
    this.tail.push(rec);
    this.tailBytes += rec.body.length;
    while (this.tailBytes > this.opts.tailCacheBytes && this.tailHead < this.tail.length - 1) {
      this.tailBytes -= this.tail[this.tailHead]!.body.length;
      this.tail[this.tailHead] = undefined as unknown as Cached;
      this.tailHead++;
    }
    if (this.tailHead > 4096 && this.tailHead * 2 > this.tail.length) {
      this.tail = this.tail.slice(this.tailHead);
      this.tailHead = 0;
    }
  }

  /**
   * Reads committed records with seq >= `fromSeq` (clamped up to firstSeq),
   * at most `maxCount` and about `maxBytes`; [] when there is nothing new.
   */
  async read(fromSeq: number, maxCount = 1000, maxBytes = 1 << 20): Promise<RawRecord[]> {
    const from = Math.max(fromSeq, this.firstSeq);
    if (from >= this.nextSeq) return [];
    const n = this.tail.length - this.tailHead;
    if (n > 0) {
      const first = this.tail[this.tailHead]!.seq;
      if (from >= first) {
        const out: RawRecord[] = [];
        let bytes = 0;
        for (let i = this.tailHead + (from - first); i < this.tail.length && out.length < maxCount && bytes < maxBytes; i++) {
          const r = this.tail[i]!;
          out.push({ seq: r.seq, body: r.body });
          bytes += r.body.length + RECORD_HEADER_BYTES;
        }
        return out;
      }
    }
    const segs = this.segments;
    let lo = 0;
    let hi = segs.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (segs[mid]!.baseSeq <= from) lo = mid;
      else hi = mid - 1;
    }
    for (let i = lo; i < segs.length; i++) {
      const seg = segs[i]!;
      if (seg.lastSeq < from) continue;
      const got = await seg.read(from, maxCount, maxBytes);
      if (got.length > 0) return got;
      this.opts.logger.error("unreadable records skipped", { channel: this.name, segment: seg.path, from_seq: from });
    }
    return [];
  }

  /** Registers a listener for newly visible records; returns its remover. */
  onCommit(listener: CommitListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** fdatasync now if anything was written since the last one (interval mode). */
  async syncNow(): Promise<void> {
    if (!this.dirty) return;
    this.dirty = false;
    const fh = this.segments[this.segments.length - 1]!.openHandle;
    if (!fh) return;
    const t = performance.now();
    await fh.datasync();
    this.opts.onFsync?.(performance.now() - t);
  }

  /**
   * Removes sealed segments by age (only past `pinnedSeq`) and by bytes (even
   * if pinned). The active segment is never removed.
   */
  async applyRetention(policy: RetentionPolicy): Promise<RetentionResult> {
    const result: RetentionResult = { removedSegments: 0, removedRecords: 0, removedBytes: 0, firstSeq: this.firstSeq };
    let total = this.bytes;
    const now = Date.now();
    while (this.segments.length > 1) {
      const seg = this.segments[0]!;
      const overBytes = policy.maxBytes !== undefined && total > policy.maxBytes;
      const tooOld = policy.maxAgeMs !== undefined && now - seg.lastWriteMs > policy.maxAgeMs && seg.lastSeq < policy.pinnedSeq;
      if (!overBytes && !tooOld) break;
      this.segments.shift();
      await seg.close();
      await unlink(seg.path).catch((err) => {
        this.opts.logger.error("could not remove segment", { channel: this.name, segment: seg.path, error: String(err) });
      });
      total -= seg.size;
      result.removedSegments++;
      result.removedRecords += seg.count;
      result.removedBytes += seg.size;
    }
    if (result.removedSegments > 0) {
      if (this.opts.sync !== "none") await fsyncDir(this.dir).catch(() => {});
      result.firstSeq = this.firstSeq;
    }
    return result;
  }

  /** Stops intake, waits for queued appends, syncs and closes every file. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    while (this.flushing) await this.flushing;
    if (this.syncTimer) clearInterval(this.syncTimer);
    const active = this.segments[this.segments.length - 1]!;
    const fh = active.openHandle;
    if (fh && this.opts.sync !== "always") await fh.datasync().catch(() => {});
    for (const s of this.segments) await s.close();
    this.listeners.clear();
  }
}
