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
 *
 * A failed fdatasync means the kernel may have dropped the bytes it could
 * not write back while its page cache still shows them, so nothing past the
 * last offset known durable is trusted again: the segment is sealed there,
 * the records that were pending are written afresh into a new segment and
 * acknowledged only after that segment's own fdatasync. If the disk will
 * not take even that, the channel refuses appends with `log_unavailable`
 * and tries again with backoff (docs/reliability.md).
 */
import { open, unlink, type FileHandle } from "node:fs/promises";
import { fdatasyncSync, ftruncateSync, writeSync } from "node:fs";
import { Scratch, uninitialized } from "../bytes.ts";
import { ClosedError, ioErrorFrom, LogUnavailableError, TooLargeError, type KeyopError } from "../errors.ts";
import type { Logger } from "../observability/logger.ts";
import { listSegments, recoverActiveSegment } from "./recovery.ts";
import { sealAtDurableEnd } from "./reseal.ts";
import { Preallocator } from "./preallocator.ts";
import { TailCache } from "./tail-cache.ts";
import { MAX_RECORD_BODY, RECORD_HEADER_BYTES, type RawRecord, recordsBytes, writeRecords } from "./record.ts";
import { Segment, type Damage } from "./segment.ts";
import { fsyncDir } from "./fsync-dir.ts";
import { Outcome } from "./outcome.ts";

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
  /** Where records are encoded for a write that nothing keeps (the logs of one store share one; default: the log's own). */
  scratch?: Scratch;
}

/** What retention may remove and what it must keep. */
export interface RetentionPolicy {
  /** Sealed segments whose last write is older than this may go (ms). */
  maxAgeMs?: number | undefined;
  /** Above this many bytes the oldest sealed segments go, cursors or not (unless `keepPinned`). */
  maxBytes?: number | undefined;
  /** Lowest seq a cursor still needs (age-based removal keeps it). */
  pinnedSeq: number;
  /** Size-based removal keeps what a cursor still needs too (a channel that refuses publishes when full). */
  keepPinned?: boolean;
}

/** How a channel's log stands with its disk, for /v1/status and /metrics. */
export interface LogHealth {
  /** "failed": the disk would not take a write, appends are refused until a retry succeeds. */
  state: "ok" | "failed";
  /** Why appends are refused (state "failed"). */
  error: { code: string; message: string } | null;
  /** fdatasyncs (and cuts of a failed write) that failed since open. */
  failedSyncs: number;
  /** Times the log went back to its durable end and went on in a fresh segment. */
  reseals: number;
  /** Committed records that could not be read back to be carried over (sync: interval). */
  lostRecords: number;
  /** Damaged stretches with valid records after them, found since open (the last few). */
  damage: Damage[];
  /** Records those stretches held, all of them counted. */
  damagedRecords: number;
}

/** What one retention pass did. */
export interface RetentionResult {
  removedSegments: number;
  removedRecords: number;
  removedBytes: number;
  firstSeq: number;
}

/** An append waiting for its write: settled by calls of `resolve` or `reject` as its methods (an `Outcome`'s are). */
export interface Pending {
  readonly body: Uint8Array;
  /** performance.now() when the append was requested. */
  readonly at: number;
  resolve(seq: number): void;
  reject(err: unknown): void;
}

/** Commit listener: called after records [firstSeq, nextSeq) became visible. */
export type CommitListener = (firstSeq: number, nextSeq: number) => void;

/** fdatasyncs allowed in flight at once (they overlap on most disks). */
const PIPELINE_DEPTH = 2;
/** Failed fdatasyncs in a row after which pending records are refused instead of written again. */
const MAX_REWRITES = 2;
/** Backoff between attempts to make a refusing log writable again (ms). */
const RETRY_FIRST_MS = 100;
const RETRY_MAX_MS = 2_000;
/** Damaged stretches kept for status (all are counted and logged). */
const DAMAGE_KEPT = 16;
/** Default preallocation step. */
const PREALLOCATE_BYTES = 1024 * 1024;
/**
 * A commit of at most this many records (and INLINE_SYNC_BYTES) with no
 * other in flight is fdatasynced on the event loop's own thread. At the
 * rates a board runs, commits carry one record each, and the thread pool's
 * round trip (a wake-up there, another back) cost more CPU than the
 * fdatasync itself; under many MQTT publishes in flight a commit carries a
 * client's window (64 by default), and the round trip cost as much again as
 * the rest of the work, where overlapping two commits on the pool gained no
 * rate. Larger commits (a forwarded backlog's batches) keep the pool, whose
 * overlap of two fdatasyncs was worth more there than the CPU; and a commit
 * of megabytes must not hold every socket and timer for its flush.
 */
const INLINE_SYNC_RECORDS = 64;
const INLINE_SYNC_BYTES = 64 * 1024;
/**
 * ...but only while this disk's fdatasyncs are quick (smoothed, ms): an SD
 * card that takes tens of ms must not hold every socket and timer of the
 * agent that long; its fdatasyncs go to the thread pool.
 */
const INLINE_SYNC_MAX_MS = 2;

/** The log of one channel. Create with `ChannelLog.open`. */
export class ChannelLog {
  readonly name: string;
  readonly dir: string;
  private readonly opts: ChannelLogOptions;
  private readonly prealloc: Preallocator;
  private readonly scratch: Scratch;
  private readonly depth: number;
  private segments: Segment[];
  private queue: Pending[] = [];
  /** The general write loop (rolls, waits, failures), while it runs. */
  private flushing: Promise<void> | null = null;
  /**
   * The common case skips that loop: a batch that needs no roll, no wait and
   * no recovery is written where it is taken, with no async function or
   * promise of its own (together a few hundred bytes of garbage a message).
   * `kickPending`: a write of what is queued is due at the end of this
   * microtask queue; `turnPending`: one was made, and the next waits for a
   * turn of the event loop.
   */
  private kickPending = false;
  private turnPending = false;
  private closed = false;
  private dirty = false;
  private syncTimer: ReturnType<typeof setInterval> | null = null;
  /** Replaced, never changed in place, when one comes or goes: a commit walks it with no iterator. */
  private listeners: readonly CommitListener[] = [];
  private readonly tail: TailCache;
  /** Written (maybe not yet durable) end of the active segment, and the seq after it. */
  private writeEnd: number;
  private writeSeq: number;
  /** fdatasyncs in flight, the ordered chain of their commits, and who waits for a slot. */
  private inflight = 0;
  private commitTail: Promise<void> = Promise.resolve();
  private slotWaiters: (() => void)[] = [];
  /** Bumped when an fdatasync fails: writes of an older epoch are written again. */
  private epoch = 0;
  /**
   * End of the bytes of the active segment known to be on the disk, and the
   * seq after them. Under `always` that is the committed end; under
   * `interval` it trails it by up to one interval.
   */
  private durableEnd: number;
  private durableSeq: number;
  /**
   * Under `interval`, the records committed past the durable end, kept in
   * memory until an fdatasync covers them: after a failed one they are
   * written again from here, since reading them back may return what the
   * disk holds rather than what was written.
   */
  private unsynced: { firstSeq: number; chunk: Pending[]; buf: Uint8Array }[] = [];
  /** Set by a failed fdatasync: seal at the durable end before anything else is written. */
  private needReseal = false;
  /** Records whose fdatasync failed (or was voided by one), to write again in order. */
  private redo: Pending[] = [];
  /** Failed fdatasyncs since the last successful commit. */
  private failuresInRow = 0;
  private lastError: KeyopError | null = null;
  /** Non-null while the log refuses appends. */
  private failure: LogUnavailableError | null = null;
  private retryTimer: ReturnType<typeof setTimeout> | null = null;
  private retryAttempt = 0;
  private readonly counters = { failedSyncs: 0, reseals: 0, lostRecords: 0, damagedRecords: 0 };
  private readonly damageSeen: Damage[] = [];
  /** Seq the next committed record gets: everything below is visible. */
  nextSeq: number;

  private constructor(name: string, dir: string, opts: ChannelLogOptions, segments: Segment[]) {
    this.name = name;
    this.dir = dir;
    this.opts = opts;
    this.prealloc = new Preallocator(opts.preallocateBytes ?? PREALLOCATE_BYTES, opts.segmentBytes);
    this.scratch = opts.scratch ?? new Scratch();
    this.tail = new TailCache(opts.tailCacheBytes);
    this.depth = Math.max(1, opts.pipelineDepth ?? PIPELINE_DEPTH);
    this.segments = segments;
    const active = segments[segments.length - 1]!;
    this.nextSeq = active.lastSeq + 1;
    this.writeSeq = this.nextSeq;
    this.writeEnd = active.size;
    this.durableEnd = active.size;
    this.durableSeq = this.nextSeq;
    for (const seg of segments) this.watchDamage(seg);
    for (const d of active.damage) this.noteDamage(d);
    if (opts.sync === "interval") {
      // syncNow reports and handles its own failures.
      this.syncTimer = setInterval(() => void this.syncNow(), opts.syncIntervalMs);
      this.syncTimer.unref?.();
    }
  }

  /**
   * Opens (or with `create`, creates) the log in `dir`. The active segment is
   * scanned and a torn or corrupt tail is cut at the last good record; sealed
   * segments are only listed.
   */
  static async open(name: string, dir: string, opts: ChannelLogOptions, how: { create?: boolean } = {}): Promise<ChannelLog> {
    const segments = await listSegments(dir, how);
    const active = segments[segments.length - 1]!;
    try {
      await recoverActiveSegment(name, active, opts.logger);
    } catch (err) {
      await active.close();
      throw err;
    }
    return new ChannelLog(name, dir, opts, segments);
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

  /**
   * Appends one encoded envelope; resolves with its seq once durable.
   * `body` is kept as it is (readers of the recent records get it), so it
   * must be an array of its own that nobody changes afterwards.
   */
  append(body: Uint8Array): Promise<number> {
    const refused = this.refusal(body);
    if (refused) return Promise.reject(refused);
    return new Promise<number>((resolve, reject) => {
      this.queue.push({ body, at: performance.now(), resolve, reject });
      this.schedule();
    });
  }

  /**
   * `append` for a caller that takes the outcome as calls of `p.resolve`
   * (with the seq, once durable) or `p.reject`, with no promise per record:
   * many appends in one turn, each its own object, share a write as
   * `append`'s do. A refusal (closed, failed, size) comes through
   * `p.reject` before this returns. `p.body` is kept as `append` keeps its
   * body. `p`'s methods must not throw: they run inside the commit.
   */
  enqueue(p: Pending): void {
    const refused = this.refusal(p.body);
    if (refused) return p.reject(refused);
    this.queue.push(p);
    this.schedule();
  }

  /** Why an append of `body` is refused now, or null when it may be queued. */
  private refusal(body: Uint8Array): Error | null {
    if (this.closed) return new ClosedError(`channel ${this.name} is closed`);
    if (this.failure) return this.failure;
    if (body.length === 0 || body.length > MAX_RECORD_BODY) return new TooLargeError(`record of ${body.length} bytes is outside 1..${MAX_RECORD_BODY}`);
    return null;
  }

  /**
   * `append`, written before it returns when nothing waits ahead of it (no
   * append queued, nor, with `always`, written this turn; no roll, fill or
   * recovery due):
   * then the seq itself once the record is as durable as the sync mode asks
   * (with `always`, after an fdatasync made right here when none is in
   * flight). Otherwise, or while that fdatasync's outcome is pending, a
   * promise, as from `append`.
   *
   * For a caller that knows nothing else will be appended in this turn (a
   * publish alone in its read): it skips the microtask, the promise and the
   * turn a lone record otherwise waits for. A burst should keep using
   * `append`, whose appends of one tick share a write.
   */
  appendNow(body: Uint8Array): number | Promise<number> {
    if (this.closed || this.failure || this.queue.length > 0 || this.flushing || this.kickPending || this.turnPending) return this.append(body);
    if (body.length === 0 || body.length > MAX_RECORD_BODY) return this.append(body);
    const p = new Outcome(body, performance.now());
    if (!this.writeNow([p])) {
      this.queue.push(p);
      this.schedule();
      return p.later();
    }
    // With fdatasyncs, as after a kick: appends made in the rest of this turn share the next
    // write and its fdatasync. Without, another lone record of this turn is written as this one
    // was; the turn and its Immediate would cost every lone record more than they save.
    if (this.opts.sync === "always") {
      this.turnPending = true;
      setImmediate(this.afterTurn);
    }
    return p.now();
  }

  /**
   * Appends several bodies (kept as they are, as `append` keeps its one) in one group commit; resolves with their
   * (consecutive) seqs once all are durable, rejects if any is not. One
   * promise for the lot: a promise per record was a visible share of a
   * hub's CPU when it stored forwarded batches of thousands.
   */
  appendMany(bodies: readonly Uint8Array[]): Promise<number[]> {
    if (this.closed) return Promise.reject(new ClosedError(`channel ${this.name} is closed`));
    if (this.failure) return Promise.reject(this.failure);
    const n = bodies.length;
    if (n === 0) return Promise.resolve([]);
    for (const body of bodies) {
      const refused = this.refusal(body);
      if (refused) return Promise.reject(refused);
    }
    return new Promise<number[]>((resolve, reject) => {
      const at = performance.now();
      // Queued together, so their seqs are consecutive: the last one's seq gives them all.
      const none = () => {};
      for (let i = 0; i < n - 1; i++) this.queue.push({ body: bodies[i]!, at, resolve: none, reject });
      this.queue.push({ body: bodies[n - 1]!, at, resolve: (last) => resolve(Array.from({ length: n }, (_, k) => last - n + 1 + k)), reject });
      this.schedule();
    });
  }

  /**
   * performance.now() of the append request of a recent record, for
   * publish-to-handler latency; undefined once it left the tail cache.
   */
  appendedAt(seq: number): number | undefined {
    return this.tail.appendedAt(seq);
  }

  /** Makes sure what is queued gets written: now at the end of this tick, or after the turn a write waits for. */
  private schedule(): void {
    if (this.flushing || this.kickPending || this.turnPending) return;
    this.kickPending = true;
    queueMicrotask(this.kick);
  }

  private readonly kick = (): void => {
    this.kickPending = false;
    if (this.flushing || this.queue.length === 0) return;
    const batch = this.queue;
    if (!this.writeNow(batch)) {
      this.flushing = this.flushLoop();
      return;
    }
    // As in the loop: the publishers resolved meanwhile queue their next appends first.
    this.turnPending = true;
    setImmediate(this.afterTurn);
  };

  private readonly afterTurn = (): void => {
    this.turnPending = false;
    if (this.queue.length > 0) this.kick();
  };

  /**
   * Writes the whole queue at once when nothing stands in the way (no
   * failure or reseal, a slot for an fdatasync, the segment open, room in
   * it, no fill to wait for). False, with nothing done, otherwise: the loop
   * takes over.
   */
  private writeNow(batch: Pending[]): boolean {
    if (this.needReseal || this.failure || this.redo.length > 0 || this.inflight >= this.depth) return false;
    const seg = this.segments[this.segments.length - 1]!;
    const fh = seg.openHandle;
    if (fh === null) return false;
    let bytes = 0;
    for (let i = 0; i < batch.length; i++) bytes += batch[i]!.body.length + RECORD_HEADER_BYTES;
    if (this.writeEnd + bytes > this.opts.segmentBytes || this.prealloc.mustWait(seg, this.writeEnd, bytes)) return false;
    // The queue's array goes with its records (a commit may keep it); a lone record's never was the queue.
    if (batch === this.queue) this.queue = [];
    try {
      // False (nothing written) only when a reseal is due, which was ruled out above.
      if (!this.writeChunkAt(seg, fh, batch)) for (const p of batch) this.redo.push(p);
    } catch (err) {
      this.failBatch(batch, 0, err);
    }
    return true;
  }

  private async flushLoop(): Promise<void> {
    // Let every append made in this tick join the first batch.
    await Promise.resolve();
    try {
      while (this.queue.length > 0 || this.redo.length > 0 || this.needReseal) {
        while (this.inflight >= this.depth) await new Promise<void>((r) => this.slotWaiters.push(r));
        if (this.needReseal) await this.recover();
        if (this.failure) {
          this.refuseWaiting(this.failure);
          continue;
        }
        if (this.needReseal) continue;
        const batch = this.redo.length > 0 ? this.redo.concat(this.queue) : this.queue;
        this.redo = [];
        this.queue = [];
        await this.writeBatch(batch);
        // Let the publishers resolved meanwhile queue their next appends first.
        await new Promise<void>((r) => setImmediate(r));
        // Nothing to recover or write again: what comes next is the common case again.
        if (!this.needReseal && this.redo.length === 0) break;
      }
    } finally {
      this.flushing = null;
    }
    if (this.queue.length > 0) this.kick();
  }

  /** Writes `batch` in chunks that fit the active segment, rolling as needed. */
  private async writeBatch(batch: Pending[]): Promise<void> {
    let i = 0;
    try {
      while (i < batch.length) {
        let seg: Segment | null = this.segments[this.segments.length - 1]!;
        const first = batch[i]!.body.length + RECORD_HEADER_BYTES;
        if (this.writeEnd > 0 && this.writeEnd + first > this.opts.segmentBytes) seg = await this.roll();
        let room = this.opts.segmentBytes - this.writeEnd;
        let j = i;
        do {
          room -= batch[j]!.body.length + RECORD_HEADER_BYTES;
          j++;
        } while (j < batch.length && room >= batch[j]!.body.length + RECORD_HEADER_BYTES);
        const chunk = i === 0 && j === batch.length ? batch : batch.slice(i, j);
        if (seg === null || !(await this.writeChunk(seg, chunk))) {
          // An fdatasync failed meanwhile: what is not written yet waits for the reseal.
          for (; i < batch.length; i++) this.redo.push(batch[i]!);
          return;
        }
        i = j;
      }
    } catch (err) {
      this.failBatch(batch, i, err);
    }
  }

  /** A write threw: the records of `batch` from `i` on are refused with the error. */
  private failBatch(batch: Pending[], i: number, err: unknown): void {
    const e = ioErrorFrom(err, `append to channel ${this.name}`);
    this.opts.logger.error("append failed", { channel: this.name, code: e.code, error: e.message, rejected: batch.length - i });
    for (; i < batch.length; i++) batch[i]!.reject(e);
  }

  /**
   * One positioned write of consecutive records; under `always` it starts
   * their fdatasync and queues the commit behind the ones in flight,
   * otherwise it commits at once. False (nothing written) when a failed
   * fdatasync asks for a reseal first; throws (nothing written) on a write
   * error.
   */
  private async writeChunk(seg: Segment, chunk: Pending[]): Promise<boolean> {
    const fh = await seg.handle();
    let bytes = 0;
    for (const p of chunk) bytes += p.body.length + RECORD_HEADER_BYTES;
    // Zeros being written must never land on a record: wait for a fill this write would cross.
    await this.prealloc.beforeWrite(seg, this.writeEnd, bytes);
    return this.writeChunkAt(seg, fh, chunk);
  }

  /** `writeChunk` once the handle is open and no fill is in the way; nothing in it awaits. */
  private writeChunkAt(seg: Segment, fh: FileHandle, chunk: Pending[]): boolean {
    // From here to the epoch taken below nothing awaits: no write lands behind a failure unseen.
    if (this.needReseal) return false;
    const firstSeq = this.writeSeq;
    // Under `interval` the records stay in memory until an fdatasync covers them; otherwise they
    // are done with once written, and go through the reused buffer.
    const keep = this.opts.sync === "interval";
    const bytes = recordsBytes(chunk);
    const buf = keep ? uninitialized(bytes) : this.scratch.take(bytes);
    writeRecords(buf, firstSeq, chunk);
    const pos = this.writeEnd;
    try {
      let done = 0;
      while (done < bytes) done += writeSync(fh.fd, buf, done, bytes - done, pos + done);
    } catch (err) {
      // Nothing partial may stay behind: cut the file back to what was written before.
      if (!this.cutTo(seg, fh.fd, pos)) this.syncFailed(err, "cut back a failed write");
      throw err;
    }
    this.writeEnd = pos + bytes;
    this.writeSeq = firstSeq + chunk.length;
    // Without preallocation (or when it failed) the records themselves grew the file.
    if (this.writeEnd > seg.allocated) seg.allocated = this.writeEnd;
    if (!this.closed && this.prealloc.due(seg, this.writeEnd)) this.preallocAhead(seg, fh);
    if (this.opts.sync !== "always") {
      this.dirty = true;
      this.commit(seg, pos, firstSeq, chunk);
      if (this.opts.sync === "none") {
        // No promise is made past the write, so there is nothing to go back to.
        this.markDurable(this.writeEnd, this.writeSeq);
      } else {
        this.unsynced.push({ firstSeq, chunk, buf });
      }
      return true;
    }
    if (this.inflight === 0 && chunk.length <= INLINE_SYNC_RECORDS && bytes <= INLINE_SYNC_BYTES && this.fsyncMs < INLINE_SYNC_MAX_MS) {
      const sfh = seg.syncHandleNow();
      if (sfh) return this.syncInline(seg, sfh, pos, firstSeq, chunk);
    }
    this.syncOnPool(seg, pos, firstSeq, chunk);
    return true;
  }

  // The closures of a write live in functions of their own: a function that makes one anywhere
  // in it allocates its scope on every call, and `writeChunkAt` runs for every commit.

  /** Zeros ahead of the records just written, unless a failure since made them moot. */
  private preallocAhead(seg: Segment, fh: FileHandle): void {
    const epoch = this.epoch;
    this.prealloc.ahead(
      seg,
      fh,
      this.writeEnd,
      () => epoch === this.epoch,
      (from) => this.cutTo(seg, fh.fd, Math.max(from, this.writeEnd)),
    );
  }

  /** `writeChunkAt`'s fdatasync on the thread pool, its commit queued behind the ones in flight. */
  private syncOnPool(seg: Segment, pos: number, firstSeq: number, chunk: Pending[]): void {
    this.inflight++;
    const epoch = this.epoch;
    const t = performance.now();
    const synced = seg.syncHandle().then(
      (sfh) =>
        sfh.datasync().then(
          () => {
            seg.releaseSyncHandle(sfh);
            this.fsyncTook(performance.now() - t);
            return null;
          },
          (err: unknown) => {
            seg.releaseSyncHandle(sfh);
            return err;
          },
        ),
      (err: unknown) => err,
    );
    const prev = this.commitTail;
    this.commitTail = (async () => {
      const err = await synced;
      await prev;
      this.inflight--;
      this.slotWaiters.shift()?.();
      if (epoch !== this.epoch) {
        // Written behind bytes the disk refused: written again after the reseal.
        for (const p of chunk) this.redo.push(p);
        return;
      }
      if (err !== null) {
        this.syncFailed(err, "fdatasync");
        for (const p of chunk) this.redo.push(p);
        return;
      }
      this.failuresInRow = 0;
      this.commit(seg, pos, firstSeq, chunk);
      this.markDurable(seg.size, this.nextSeq);
    })();
  }

  /** fdatasyncs take this long here lately (ms, smoothed): whether the next may run inline. */
  private fsyncMs = 0;

  private fsyncTook(ms: number): void {
    this.fsyncMs += (ms - this.fsyncMs) / 8;
    this.opts.onFsync?.(ms);
  }

  /**
   * `writeChunk`'s commit when nothing else is in flight: the fdatasync
   * right here, then the commit, all in this turn. Same outcomes as the
   * pipelined path: on failure the records wait for the reseal.
   */
  private syncInline(seg: Segment, sfh: FileHandle, pos: number, firstSeq: number, chunk: Pending[]): boolean {
    const t = performance.now();
    try {
      fdatasyncSync(sfh.fd);
    } catch (err) {
      seg.releaseSyncHandle(sfh);
      this.syncFailed(err, "fdatasync");
      for (const p of chunk) this.redo.push(p);
      return true;
    }
    seg.releaseSyncHandle(sfh);
    this.fsyncTook(performance.now() - t);
    this.failuresInRow = 0;
    this.commit(seg, pos, firstSeq, chunk);
    this.markDurable(seg.size, this.nextSeq);
    return true;
  }

  /**
   * The disk refused an fdatasync (or a cut): nothing written since the
   * durable end can be trusted. Writes stop until `recover` has sealed the
   * segment there; whatever was in flight is written again.
   */
  private syncFailed(err: unknown, what: string): void {
    const e = ioErrorFrom(err, `${what} of channel ${this.name}`);
    this.counters.failedSyncs++;
    this.failuresInRow++;
    this.lastError = e;
    this.epoch++;
    this.needReseal = true;
    this.opts.logger.error("fdatasync failed", { channel: this.name, code: e.code, error: e.message, durable_seq: this.durableSeq, next_seq: this.nextSeq, in_a_row: this.failuresInRow });
    this.flushing ??= this.flushLoop();
  }

  /**
   * Runs once nothing is in flight after a failure: seals the active segment
   * at its durable end and goes on in a fresh one that has just taken a
   * write and an fdatasync; or, after too many failures in a row or when
   * even that fails, refuses appends and tries again later.
   */
  private async recover(): Promise<void> {
    await this.drain();
    await this.prealloc.pending;
    this.needReseal = false;
    if (!this.failure && this.failuresInRow > MAX_REWRITES) {
      this.refuse(this.lastError);
      return;
    }
    try {
      await this.reseal();
    } catch (err) {
      const e = ioErrorFrom(err, `reseal of channel ${this.name}`);
      this.counters.failedSyncs++;
      this.lastError = e;
      this.opts.logger.error("could not make the log writable", { channel: this.name, code: e.code, error: e.message, attempt: this.retryAttempt });
      if (this.failure) this.scheduleRetry();
      else this.refuse(e);
      return;
    }
    this.counters.reseals++;
    if (this.failure) {
      this.opts.logger.warn("channel log writable again", { channel: this.name, next_seq: this.nextSeq, attempts: this.retryAttempt });
      this.failure = null;
      this.retryAttempt = 0;
      this.failuresInRow = 0;
    }
  }

  /** Refuses every append from now on with `log_unavailable`, and schedules a retry. */
  private refuse(cause: KeyopError | null): void {
    this.failure = new LogUnavailableError(`channel ${this.name} cannot write to its disk${cause ? `: ${cause.message}` : ""}; retrying`, cause ?? undefined);
    this.opts.logger.error("channel log refuses appends", { channel: this.name, code: cause?.code, error: cause?.message, next_seq: this.nextSeq });
    this.refuseWaiting(this.failure);
    this.scheduleRetry();
  }

  private refuseWaiting(err: KeyopError): void {
    const waiting = this.redo.concat(this.queue);
    this.redo = [];
    this.queue = [];
    for (const p of waiting) p.reject(err);
  }

  private scheduleRetry(): void {
    if (this.closed || this.retryTimer) return;
    const ms = Math.min(RETRY_MAX_MS, RETRY_FIRST_MS * 2 ** this.retryAttempt);
    this.retryAttempt++;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      if (this.closed) return;
      this.needReseal = true;
      this.flushing ??= this.flushLoop();
    }, ms);
  }

  /**
   * Seals the active segment at its durable end and starts a fresh one
   * there (or, when nothing of the active one is durable, starts that one
   * over). Committed records past the durable end (sync: interval) are
   * carried into it; then it takes a write and an fdatasync on handles
   * opened after the failure, which is what vouches for it. Throws if the
   * disk refuses any step; the log is then as it was.
   */
  private async reseal(): Promise<void> {
    const active = this.segments[this.segments.length - 1]!;
    const carried = this.durableSeq < this.nextSeq ? await this.readCarried(active) : [];
    const { fresh, end } = await sealAtDurableEnd({
      channel: this.name,
      dir: this.dir,
      active,
      durableEnd: this.durableEnd,
      durableSeq: this.durableSeq,
      nextSeq: this.nextSeq,
      carried,
      watch: (seg) => this.watchDamage(seg),
      logger: this.opts.logger,
    });
    if (fresh !== active) this.segments.push(fresh);
    this.writeEnd = end;
    this.writeSeq = this.nextSeq;
    this.markDurable(end, this.nextSeq);
    this.opts.logger.warn("log resealed after a failed fdatasync", { channel: this.name, segment: fresh.path, durable_seq: fresh.baseSeq, carried: carried.length, next_seq: this.nextSeq });
  }

  /** Everything before `end` (seqs before `seq`) is on the disk: the in-memory copies go. */
  private markDurable(end: number, seq: number): void {
    this.durableEnd = end;
    this.durableSeq = seq;
    let drop = 0;
    while (drop < this.unsynced.length && this.unsynced[drop]!.firstSeq + this.unsynced[drop]!.chunk.length <= seq) drop++;
    if (drop > 0) this.unsynced.splice(0, drop);
  }

  /**
   * Committed records from the durable end on (sync: interval), kept in
   * memory since their write (read back from the segment only if not), to be
   * written again; those that cannot be had are counted and logged.
   */
  private async readCarried(seg: Segment): Promise<RawRecord[]> {
    const out: RawRecord[] = [];
    let from = this.durableSeq;
    for (const u of this.unsynced) {
      // The encoded chunk, not the bodies handed in: a caller may reuse its buffers once acknowledged.
      let off = 0;
      for (let k = 0; k < u.chunk.length; k++) {
        const len = u.chunk[k]!.body.length;
        if (u.firstSeq + k === from) {
          out.push({ seq: from, body: u.buf.subarray(off + RECORD_HEADER_BYTES, off + RECORD_HEADER_BYTES + len) });
          from++;
        }
        off += RECORD_HEADER_BYTES + len;
      }
    }
    // Anything not kept in memory (none in the normal course) is read back and checked by CRC.
    while (from < this.nextSeq) {
      let got: RawRecord[] = [];
      try {
        got = await seg.read(from, 1000, 1 << 20);
      } catch (err) {
        this.opts.logger.error("could not read back records to carry over", { channel: this.name, from_seq: from, error: String(err) });
      }
      if (got.length === 0) break;
      for (const r of got) out.push({ seq: r.seq, body: r.body.slice() });
      from = got[got.length - 1]!.seq + 1;
    }
    const lost = this.nextSeq - this.durableSeq - out.length;
    if (lost > 0) {
      this.counters.lostRecords += lost;
      this.opts.logger.error("records lost with a failed fdatasync", { channel: this.name, from_seq: this.durableSeq, next_seq: this.nextSeq, lost });
    }
    return out;
  }

  private watchDamage(seg: Segment): void {
    seg.onDamage = (d) => this.noteDamage(d);
  }

  private noteDamage(d: Damage): void {
    const records = d.lastSeq - d.firstSeq + 1;
    this.counters.damagedRecords += records;
    this.damageSeen.push(d);
    if (this.damageSeen.length > DAMAGE_KEPT) this.damageSeen.shift();
    this.opts.logger.error("corruption in the middle of a segment: the records after it are kept", {
      channel: this.name,
      segment: d.segment,
      offset: d.offset,
      bytes: d.bytes,
      reason: d.reason,
      first_lost_seq: d.firstSeq,
      last_lost_seq: d.lastSeq,
      lost: records,
    });
  }

  /** How the log stands with its disk. */
  health(): LogHealth {
    return {
      state: this.failure ? "failed" : "ok",
      error: this.failure ? { code: this.failure.code, message: this.failure.message } : null,
      ...this.counters,
      damage: [...this.damageSeen],
    };
  }

  /** Makes records written at `pos` visible, resolves their publishers, wakes readers. */
  private commit(seg: Segment, pos: number, firstSeq: number, chunk: Pending[]): void {
    let off = pos;
    const cache = this.tail.wanted(this.listeners.length > 0);
    for (let k = 0; k < chunk.length; k++) {
      const seq = firstSeq + k;
      seg.noteAppended(seq, off);
      const body = chunk[k]!.body;
      // The appended body itself, not a view of `buf`: every body appended is an array of its
      // own (a new envelope, or a forwarded one with this instance added to its route), and
      // a first view of a small new array moves its bytes out of the JavaScript heap.
      if (cache) this.tail.push(seq, body, chunk[k]!.at);
      off += RECORD_HEADER_BYTES + body.length;
    }
    seg.size = off;
    seg.lastSeq = firstSeq + chunk.length - 1;
    seg.lastWriteMs = Date.now();
    this.nextSeq = firstSeq + chunk.length;
    for (let k = 0; k < chunk.length; k++) chunk[k]!.resolve(firstSeq + k);
    const listeners = this.listeners;
    for (let i = 0; i < listeners.length; i++) {
      try {
        listeners[i]!(firstSeq, this.nextSeq);
      } catch (err) {
        this.opts.logger.error("commit listener failed", { channel: this.name, error: String(err) });
      }
    }
  }

  /** Truncates the active segment to `size`, dropping preallocated space after it; false if the disk refused. */
  private cutTo(seg: Segment, fd: number, size: number): boolean {
    try {
      ftruncateSync(fd, size);
      seg.allocated = size;
      return true;
    } catch (err) {
      this.opts.logger.error("could not cut back the segment", { channel: this.name, segment: seg.path, error: String(err) });
      return false;
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

  /**
   * Seals the active segment (cut to its records, synced) and starts a new
   * one. Null when an fdatasync failed, before or here: the reseal comes first.
   */
  private async roll(): Promise<Segment | null> {
    await this.drain();
    await this.prealloc.pending;
    if (this.needReseal) return null;
    const old = this.segments[this.segments.length - 1]!;
    const oldFh = await old.handle();
    if (!this.cutTo(old, oldFh.fd, old.size)) {
      this.syncFailed(new Error("ftruncate failed"), "seal");
      return null;
    }
    if (this.opts.sync !== "none") {
      const sfh = await old.syncHandle();
      try {
        await sfh.datasync();
      } catch (err) {
        this.syncFailed(err, "fdatasync at seal");
        return null;
      } finally {
        old.releaseSyncHandle(sfh);
      }
    }
    const seg = new Segment(this.dir, this.nextSeq, 0, this.nextSeq - 1, Date.now());
    this.watchDamage(seg);
    seg.adopt(await open(seg.path, "w+"));
    if (this.opts.sync !== "none") await fsyncDir(this.dir);
    old.maxSeq = this.nextSeq - 1;
    this.segments.push(seg);
    this.writeEnd = 0;
    this.writeSeq = this.nextSeq;
    this.markDurable(0, this.nextSeq);
    await old.close();
    this.opts.logger.debug("segment rolled", { channel: this.name, sealed: old.path, next_seq: this.nextSeq });
    return seg;
  }

  /**
   * `read` without waiting, for a reader that keeps up: the records when
   * the tail cache holds them, [] when there is nothing new, null when they
   * must come from disk (then `read`).
   */
  readNow(fromSeq: number, maxCount = 1000, maxBytes = 1 << 20): RawRecord[] | null {
    this.tail.noteRead();
    const from = Math.max(fromSeq, this.firstSeq);
    if (from >= this.nextSeq) return [];
    return this.tail.read(from, maxCount, maxBytes);
  }

  /**
   * Reads committed records with seq >= `fromSeq` (clamped up to firstSeq),
   * at most `maxCount` and about `maxBytes`; [] when there is nothing new.
   */
  async read(fromSeq: number, maxCount = 1000, maxBytes = 1 << 20): Promise<RawRecord[]> {
    const now = this.readNow(fromSeq, maxCount, maxBytes);
    if (now) return now;
    const from = Math.max(fromSeq, this.firstSeq);
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
    if (!this.listeners.includes(listener)) this.listeners = [...this.listeners, listener];
    return () => {
      this.listeners = this.listeners.filter((l) => l !== listener);
    };
  }

  /**
   * fdatasync now if anything was written since the last one (interval
   * mode). A failure is logged, counted and handled like one under
   * `always`: the log goes back to the last durable end and carries the
   * records after it into a fresh segment, which is the retry.
   */
  async syncNow(): Promise<void> {
    if (!this.dirty || this.needReseal || this.failure || this.closed) return;
    this.dirty = false;
    const seg = this.segments[this.segments.length - 1]!;
    if (!seg.openHandle) return;
    const end = this.writeEnd;
    const seq = this.writeSeq;
    const epoch = this.epoch;
    const t = performance.now();
    let sfh: FileHandle | null = null;
    try {
      sfh = await seg.syncHandle();
      await sfh.datasync();
    } catch (err) {
      if (epoch === this.epoch && seg === this.segments[this.segments.length - 1]) this.syncFailed(err, "periodic fdatasync");
      return;
    } finally {
      if (sfh) seg.releaseSyncHandle(sfh);
    }
    this.opts.onFsync?.(performance.now() - t);
    if (epoch === this.epoch && seg === this.segments[this.segments.length - 1] && end > this.durableEnd) this.markDurable(end, seq);
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
      const overBytes = policy.maxBytes !== undefined && total > policy.maxBytes && (!policy.keepPinned || seg.lastSeq < policy.pinnedSeq);
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
      // The removals are done either way; a failed directory sync only means a crash may bring a removed file back.
      if (this.opts.sync !== "none") await fsyncDir(this.dir).catch((err) => this.opts.logger.warn("directory sync after retention failed", { channel: this.name, error: String(err) }));
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
    // Queued appends are written first, by the loop or by the write due now or after a turn.
    while (this.flushing || this.kickPending || this.turnPending) await (this.flushing ?? new Promise<void>((r) => setImmediate(r)));
    await this.drain();
    await this.prealloc.pending;
    if (this.syncTimer) clearInterval(this.syncTimer);
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.retryTimer = null;
    const active = this.segments[this.segments.length - 1]!;
    const fh = active.openHandle;
    if (fh && !this.failure) {
      this.cutTo(active, fh.fd, active.size);
      const sfh = await active.syncHandle().catch(() => null);
      try {
        await (sfh ?? fh).datasync();
      } catch (err) {
        // Under `always` everything committed was synced already; under `interval` the last interval may be lost.
        this.opts.logger.error("fdatasync at close failed", { channel: this.name, code: ioErrorFrom(err, "close").code, error: String(err), durable_seq: this.durableSeq, next_seq: this.nextSeq });
      } finally {
        if (sfh) active.releaseSyncHandle(sfh);
      }
    }
    for (const s of this.segments) await s.close();
    this.listeners = [];
  }
}
