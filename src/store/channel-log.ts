/**
 * The append-only log of one channel: a directory of segments.
 *
 * Appends are gathered by group commit: everything queued while the disk is
 * busy goes out as one positioned write and one fdatasync. The fdatasync
 * runs on the thread pool (promise API), so the event loop keeps gathering,
 * and up to PIPELINE_DEPTH of them may be in flight at once; commits still
 * happen strictly in order. A record becomes visible to readers only once it
 * is as durable as the sync mode promises, so under `sync: always` no reader
 * ever sees a record that a crash could take back.
 *
 * The active segment is preallocated with zeros a step ahead of the write
 * position: an fdatasync that only overwrites already-allocated blocks need
 * not commit file-size metadata, which on ext4 roughly halves its cost for
 * batched writes (docs/storage.md has the figures).
 */
import { mkdir, open, readdir, stat, unlink, type FileHandle } from "node:fs/promises";
import { ftruncateSync, writeSync } from "node:fs";
import { join } from "node:path";
import { ClosedError, ioErrorFrom, TooLargeError, type KeyopError } from "../errors.ts";
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
  /** Bytes of zeros written ahead of the records (0 turns it off). */
  preallocateBytes?: number;
  /** fdatasyncs allowed in flight at once (default PIPELINE_DEPTH). */
  pipelineDepth?: number;
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

/** fdatasyncs allowed in flight at once (they overlap on most disks). */
const PIPELINE_DEPTH = 2;
/** A reader idle this long (ms) no longer keeps the tail cache filled. */
const CACHE_IDLE_MS = 2_000;
/** Default preallocation step. */
const PREALLOCATE_BYTES = 1024 * 1024;
let zeroBlock: Uint8Array | null = null;

/** The log of one channel. Create with `ChannelLog.open`. */
export class ChannelLog {
  readonly name: string;
  readonly dir: string;
  private readonly opts: ChannelLogOptions;
  private readonly preallocate: number;
  private readonly depth: number;
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
  /** performance.now() of the last read: the tail cache is kept only while someone reads. */
  private lastReadAt = -Infinity;
  /** Written (maybe not yet durable) end of the active segment, and the seq after it. */
  private writeEnd: number;
  private writeSeq: number;
  /** fdatasyncs in flight, the ordered chain of their commits, and who waits for a slot. */
  private inflight = 0;
  private commitTail: Promise<void> = Promise.resolve();
  private slotWaiters: (() => void)[] = [];
  /** Bumped when an fdatasync fails: writes of an older epoch are void. */
  private epoch = 0;
  private syncError: KeyopError | null = null;
  /** The zero-fill of the next preallocation step, running on the thread pool. */
  private extending: Promise<void> | null = null;
  /** Seq the next committed record gets: everything below is visible. */
  nextSeq: number;

  private constructor(name: string, dir: string, opts: ChannelLogOptions, segments: Segment[]) {
    this.name = name;
    this.dir = dir;
    this.opts = opts;
    this.preallocate = opts.preallocateBytes ?? PREALLOCATE_BYTES;
    this.depth = Math.max(1, opts.pipelineDepth ?? PIPELINE_DEPTH);
    this.segments = segments;
    const active = segments[segments.length - 1]!;
    this.nextSeq = active.lastSeq + 1;
    this.writeSeq = this.nextSeq;
    this.writeEnd = active.size;
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
    return new ChannelLog(name, dir, opts, segments);
  }

  /**
   * Scans the active segment. Zeros after the last record are preallocated
   * space (kept); anything else there is a torn or corrupt tail, cut off
   * and reported with its byte count.
   */
  private static async recoverTail(name: string, active: Segment, opts: ChannelLogOptions): Promise<void> {
    const scan = await active.scan();
    active.allocated = scan.fileBytes;
    if (scan.validBytes === scan.fileBytes) return;
    const fh = await active.handle();
    if (await onlyZeros(fh, scan.validBytes, scan.fileBytes)) return;
    const cut = scan.fileBytes - scan.validBytes;
    await fh.truncate(scan.validBytes);
    await fh.datasync();
    active.allocated = scan.validBytes;
    opts.logger.warn("recovered torn tail", {
      channel: name,
      segment: active.path,
      reason: scan.stop,
      cut_bytes: cut,
      kept_bytes: scan.validBytes,
      last_seq: scan.lastSeq,
    });
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

  /** Bytes of the committed records from `seq` on (see Segment#bytesFrom for how exact). */
  bytesFrom(seq: number): number {
    let total = 0;
    for (const s of this.segments) total += s.bytesFrom(seq);
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

  /**
   * Appends several bodies in one group commit; resolves with their
   * (consecutive) seqs once all are durable, rejects if any is not. One
   * promise for the lot: a promise per record was a visible share of a
   * hub's CPU when it stored forwarded batches of thousands.
   */
  appendMany(bodies: readonly Uint8Array[]): Promise<number[]> {
    if (this.closed) return Promise.reject(new ClosedError(`channel ${this.name} is closed`));
    const n = bodies.length;
    if (n === 0) return Promise.resolve([]);
    for (const body of bodies) {
      if (body.length === 0 || body.length > MAX_RECORD_BODY) {
        return Promise.reject(new TooLargeError(`record of ${body.length} bytes is outside 1..${MAX_RECORD_BODY}`));
      }
    }
    return new Promise<number[]>((resolve, reject) => {
      const at = performance.now();
      // Queued together, so their seqs are consecutive: the last one's seq gives them all.
      const none = () => {};
      for (let i = 0; i < n - 1; i++) this.queue.push({ body: bodies[i]!, at, resolve: none, reject });
      this.queue.push({ body: bodies[n - 1]!, at, resolve: (last) => resolve(Array.from({ length: n }, (_, k) => last - n + 1 + k)), reject });
      this.flushing ??= this.flushLoop();
    });
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
        while (this.inflight >= this.depth) await new Promise<void>((r) => this.slotWaiters.push(r));
        const batch = this.queue;
        this.queue = [];
        await this.writeBatch(batch);
        // Let the publishers resolved meanwhile queue their next appends first.
        await new Promise<void>((r) => setImmediate(r));
      }
    } finally {
      this.flushing = null;
    }
  }

  /** Writes `batch` in chunks that fit the active segment, rolling as needed. */
  private async writeBatch(batch: Pending[]): Promise<void> {
    let i = 0;
    try {
      while (i < batch.length) {
        let seg = this.segments[this.segments.length - 1]!;
        const first = batch[i]!.body.length + RECORD_HEADER_BYTES;
        if (this.writeEnd > 0 && this.writeEnd + first > this.opts.segmentBytes) seg = await this.roll();
        let room = this.opts.segmentBytes - this.writeEnd;
        let j = i;
        do {
          room -= batch[j]!.body.length + RECORD_HEADER_BYTES;
          j++;
        } while (j < batch.length && room >= batch[j]!.body.length + RECORD_HEADER_BYTES);
        const chunk = i === 0 && j === batch.length ? batch : batch.slice(i, j);
        await this.writeChunk(seg, chunk);
        i = j;
      }
    } catch (err) {
      const e = ioErrorFrom(err, `append to channel ${this.name}`);
      this.opts.logger.error("append failed", { channel: this.name, code: e.code, error: e.message, rejected: batch.length - i });
      for (; i < batch.length; i++) batch[i]!.reject(e);
    }
  }

  /**
   * One positioned write of consecutive records; under `always` it starts
   * their fdatasync and queues the commit behind the ones in flight,
   * otherwise it commits at once. Throws (nothing written) on a write error.
   */
  private async writeChunk(seg: Segment, chunk: Pending[]): Promise<void> {
    const fh = await seg.handle();
    const firstSeq = this.writeSeq;
    const buf = encodeRecords(firstSeq, chunk.map((p) => p.body));
    const pos = this.writeEnd;
    // Zeros being written must never land on a record: wait for a fill this write would cross.
    if (this.extending && pos + buf.length > seg.allocated) await this.extending;
    try {
      let done = 0;
      while (done < buf.length) done += writeSync(fh.fd, buf, done, buf.length - done, pos + done);
    } catch (err) {
      // Nothing partial may stay behind: cut the file back to what was written before.
      this.cutTo(seg, fh.fd, pos);
      throw err;
    }
    this.writeEnd = pos + buf.length;
    this.writeSeq = firstSeq + chunk.length;
    // Without preallocation (or when it failed) the records themselves grew the file.
    if (this.writeEnd > seg.allocated) seg.allocated = this.writeEnd;
    this.preallocateAhead(seg, fh);
    if (this.opts.sync !== "always") {
      this.dirty = true;
      this.commit(seg, pos, firstSeq, chunk, buf);
      return;
    }
    this.inflight++;
    const epoch = this.epoch;
    const t = performance.now();
    const synced = fh.datasync().then(
      () => {
        this.opts.onFsync?.(performance.now() - t);
        return null;
      },
      (err: unknown) => err,
    );
    const prev = this.commitTail;
    this.commitTail = (async () => {
      const err = await synced;
      await prev;
      this.inflight--;
      this.slotWaiters.shift()?.();
      if (epoch !== this.epoch) {
        for (const p of chunk) p.reject(this.syncError);
        return;
      }
      if (err !== null) {
        // The disk refused: nothing after the last durable byte can be trusted.
        const e = ioErrorFrom(err, `fdatasync of channel ${this.name}`);
        this.epoch++;
        this.syncError = e;
        this.cutTo(seg, fh.fd, seg.size);
        this.writeEnd = seg.size;
        this.writeSeq = this.nextSeq;
        this.opts.logger.error("fdatasync failed", { channel: this.name, code: e.code, error: e.message });
        for (const p of chunk) p.reject(e);
        return;
      }
      this.commit(seg, pos, firstSeq, chunk, buf);
    })();
  }

  /** Makes records written at `pos` visible, resolves their publishers, wakes readers. */
  private commit(seg: Segment, pos: number, firstSeq: number, chunk: Pending[], buf: Uint8Array): void {
    let off = pos;
    const cache = this.opts.tailCacheBytes > 0 && this.cacheWanted();
    if (!cache && this.tail.length > 0) this.dropTail();
    for (let k = 0; k < chunk.length; k++) {
      const seq = firstSeq + k;
      seg.noteAppended(seq, off);
      const len = chunk[k]!.body.length;
      if (cache) {
        const start = off - pos + RECORD_HEADER_BYTES;
        this.pushTail({ seq, body: buf.subarray(start, start + len), at: chunk[k]!.at });
      }
      off += RECORD_HEADER_BYTES + len;
    }
    seg.size = off;
    seg.lastSeq = firstSeq + chunk.length - 1;
    seg.lastWriteMs = Date.now();
    this.nextSeq = firstSeq + chunk.length;
    for (let k = 0; k < chunk.length; k++) chunk[k]!.resolve(firstSeq + k);
    for (const l of this.listeners) {
      try {
        l(firstSeq, this.nextSeq);
      } catch (err) {
        this.opts.logger.error("commit listener failed", { channel: this.name, error: String(err) });
      }
    }
  }

  /**
   * Starts zero-filling the next step of the active segment on the thread
   * pool once the written end comes within half a step of the allocated end,
   * so record writes keep landing on allocated blocks without the event loop
   * ever waiting for a megabyte of zeros.
   */
  private preallocateAhead(seg: Segment, fh: FileHandle): void {
    if (this.preallocate <= 0 || this.extending || this.closed) return;
    if (this.writeEnd + this.preallocate / 2 <= seg.allocated) return;
    const from = seg.allocated;
    const to = Math.min(from + this.preallocate, Math.max(this.opts.segmentBytes, from));
    if (to <= from) return;
    zeroBlock ??= new Uint8Array(PREALLOCATE_BYTES);
    const epoch = this.epoch;
    this.extending = (async () => {
      try {
        let at = from;
        while (at < to) at += (await fh.write(zeroBlock!, 0, Math.min(zeroBlock!.length, to - at), at)).bytesWritten;
        if (epoch === this.epoch && seg.allocated === from) seg.allocated = to;
      } catch {
        // No room to preallocate (disk nearly full): drop the partial zeros (nothing was
        // written past `from` meanwhile) and let record writes extend the file themselves.
        if (epoch === this.epoch && seg.allocated === from) this.cutTo(seg, fh.fd, Math.max(from, this.writeEnd));
      } finally {
        this.extending = null;
      }
    })();
  }

  /** Truncates the active segment to `size`, dropping preallocated space after it. */
  private cutTo(seg: Segment, fd: number, size: number): void {
    try {
      ftruncateSync(fd, size);
      seg.allocated = size;
    } catch (err) {
      this.opts.logger.error("could not cut back the segment", { channel: this.name, segment: seg.path, error: String(err) });
    }
  }

  /** Waits until every write in flight is committed (or failed). */
  private async drain(): Promise<void> {
    let tail: Promise<void>;
    do {
      tail = this.commitTail;
      await tail;
    } while (tail !== this.commitTail);
  }

  /** Seals the active segment (cut to its records, synced) and starts a new one. */
  private async roll(): Promise<Segment> {
    await this.drain();
    if (this.extending) await this.extending;
    const old = this.segments[this.segments.length - 1]!;
    const oldFh = await old.handle();
    this.cutTo(old, oldFh.fd, old.size);
    if (this.opts.sync !== "none") await oldFh.datasync();
    const seg = new Segment(this.dir, this.nextSeq, 0, this.nextSeq - 1, Date.now());
    seg.adopt(await open(seg.path, "w+"));
    if (this.opts.sync !== "none") await fsyncDir(this.dir);
    this.segments.push(seg);
    this.writeEnd = 0;
    this.writeSeq = this.nextSeq;
    await old.close();
    this.opts.logger.debug("segment rolled", { channel: this.name, sealed: old.path, next_seq: this.nextSeq });
    return seg;
  }

  /**
   * Whether commits should go to the tail cache: while a reader waits for
   * commits (a subscription, a forwarder, a long poll) or has read within
   * CACHE_IDLE_MS. Holding the last megabyte of records for nobody was
   * not free: kept past the young generation, every record became old
   * garbage for the full collections, and an ingest with no reader ran
   * about 12% slower with the cache than without (MQTT QoS 1 at 64 in
   * flight, paired rounds; docs/benchmarks.md).
   */
  private cacheWanted(): boolean {
    return this.listeners.size > 0 || performance.now() - this.lastReadAt < CACHE_IDLE_MS;
  }

  /** Empties the tail cache (it restarts, contiguous, at the next commit). */
  private dropTail(): void {
    this.tail = [];
    this.tailHead = 0;
    this.tailBytes = 0;
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
    this.lastReadAt = performance.now();
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
    // On to the next segments while the batch has room: a reader catching up gets a full batch
    // even where segments are small, not one segment's end per call.
    const out: RawRecord[] = [];
    let bytes = 0;
    let next = from;
    for (let i = lo; i < segs.length && out.length < maxCount && bytes < maxBytes; i++) {
      const seg = segs[i]!;
      if (seg.lastSeq < next) continue;
      const got = await seg.read(next, maxCount - out.length, maxBytes - bytes);
      if (got.length === 0) {
        if (out.length > 0) break; // keep a batch contiguous; the next call reports the damage
        this.opts.logger.error("unreadable records skipped", { channel: this.name, segment: seg.path, from_seq: next });
        continue;
      }
      for (const r of got) {
        out.push(r);
        bytes += r.body.length + RECORD_HEADER_BYTES;
      }
      next = got[got.length - 1]!.seq + 1;
      // Only a next segment that starts right here continues the batch; anything else (damage
      // that cut this segment short) is left to the next call, which reports and skips it.
      if (i + 1 < segs.length && segs[i + 1]!.baseSeq !== next) break;
    }
    return out;
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

  /**
   * Stops intake, waits for queued appends, cuts the preallocated space off
   * the active segment, syncs and closes every file.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    while (this.flushing) await this.flushing;
    await this.drain();
    if (this.extending) await this.extending;
    if (this.syncTimer) clearInterval(this.syncTimer);
    const active = this.segments[this.segments.length - 1]!;
    const fh = active.openHandle;
    if (fh) {
      this.cutTo(active, fh.fd, active.size);
      await fh.datasync().catch(() => {});
    }
    for (const s of this.segments) await s.close();
    this.listeners.clear();
  }
}

/** True when bytes [from, to) of the file are all zero. */
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
