/**
 * The outbound side of a stream socket: bytes queued during one turn of the
 * event loop go out in one write, and what the socket does not take waits
 * for its drain callback, in order.
 *
 * Every socket write is a syscall (and for TLS a record) that wakes the
 * peer; writes of single small frames and of one PUBACK each were the
 * largest share of the hub's and the MQTT listener's CPU profiles
 * (docs/benchmarks.md). Joining them is the cheapest speed-up there is.
 */

/** Writes to the socket; returns how many bytes it took (Bun: may be fewer, or -1). */
export type RawWrite = (bytes: Uint8Array) => number;

/** Queued chunks smaller than this are joined into one write. */
const COALESCE_BYTES = 64 * 1024;

/** `pushCopy`'s staging buffer, and the most it copies there (more is queued as a copy of its own). */
const STAGE_BYTES = 4096;
const STAGE_COPY_BYTES = 256;

/** A socket's outbound queue with per-turn coalescing and backpressure. */
export class OutQueue {
  private readonly write: RawWrite;
  private readonly highWater: number;
  private out: Uint8Array[] = [];
  private outBytes = 0;
  private waiters: (() => void)[] = [];
  /** A flush is scheduled for the end of this turn. */
  private scheduled = false;
  /** The socket took less than offered: nothing more until its drain callback. */
  private blocked = false;
  private closed = false;
  /**
   * Copies made by `pushCopy`, one after another: the run from `stageFrom`
   * to `stageAt` is not queued yet, and goes in as one view when anything
   * else is queued or the queue is written. Reused from the start once
   * nothing queued is a view of it.
   */
  private stage: Uint8Array | null = null;
  private stageFrom = 0;
  private stageAt = 0;

  /** `highWater`: queued bytes above which `push` returns false and `writable()` waits. */
  constructor(write: RawWrite, highWater: number) {
    this.write = write;
    this.highWater = highWater;
  }

  /** Bytes waiting to be written. */
  get bytes(): number {
    return this.outBytes;
  }

  /**
   * Queues bytes, written at the end of this turn together with whatever
   * else is queued by then. Returns false above the high-water mark: the
   * caller should await `writable()` before queueing more.
   */
  push(bytes: Uint8Array): boolean {
    if (this.closed) return false;
    this.sealStage();
    this.out.push(bytes);
    this.outBytes += bytes.length;
    this.scheduleFlush();
    return this.outBytes <= this.highWater;
  }

  /**
   * `push` of a copy of `bytes`, which the caller may change as soon as this
   * returns: for the small packets a connection sends many of in a turn (a
   * window's PUBACKs), which then cost no array each and go out as one run.
   */
  pushCopy(bytes: Uint8Array): boolean {
    if (this.closed) return false;
    const n = bytes.length;
    if (n > STAGE_COPY_BYTES) return this.push(bytes.slice());
    let stage = this.stage;
    if (stage === null || this.stageAt + n > stage.length) {
      this.sealStage();
      stage = new Uint8Array(STAGE_BYTES);
      this.stage = stage;
      this.stageFrom = 0;
      this.stageAt = 0;
    }
    let at = this.stageAt;
    for (let i = 0; i < n; i++) stage[at++] = bytes[i]!;
    this.stageAt = at;
    this.outBytes += n;
    this.scheduleFlush();
    return this.outBytes <= this.highWater;
  }

  private scheduleFlush(): void {
    if (!this.scheduled && !this.blocked) {
      this.scheduled = true;
      setImmediate(this.flushSoon);
    }
  }

  /** Queues the staged run (its bytes were counted when copied). */
  private sealStage(): void {
    if (this.stageAt === this.stageFrom) return;
    this.out.push(this.stage!.subarray(this.stageFrom, this.stageAt));
    this.stageFrom = this.stageAt;
  }

  /**
   * Writes bytes now, after whatever is queued, rather than at the end of
   * the turn: for a caller that knows nothing else of this turn will join
   * them (the turn's callback would cost more than the join saves). Returns
   * as `push` does.
   */
  pushNow(bytes: Uint8Array): boolean {
    if (this.closed) return false;
    this.sealStage();
    if (this.blocked || this.out.length > 0) {
      const below = this.push(bytes);
      if (!this.blocked) this.flush();
      return below;
    }
    const written = Math.max(0, this.write(bytes));
    if (written < bytes.length) {
      this.out.push(bytes.subarray(written));
      this.outBytes += bytes.length - written;
      this.blocked = true;
    }
    return this.outBytes <= this.highWater;
  }

  /** Writes what is queued now (unless the socket is blocked), e.g. just before ending it. */
  flushNow(): void {
    if (!this.blocked) this.flush();
  }

  /** The socket's drain callback: write what waits. */
  drained(): void {
    this.blocked = false;
    this.flush();
  }

  /** More than the high-water mark is queued: `writable()` would wait. */
  get full(): boolean {
    return !this.closed && this.outBytes > this.highWater;
  }

  /** Resolves once the queue is below the high-water mark (or closed). */
  writable(): Promise<void> {
    if (this.outBytes <= this.highWater || this.closed) return Promise.resolve();
    return new Promise((r) => this.waiters.push(r));
  }

  /** Drops what is queued and releases every waiter: the connection is gone. */
  close(): void {
    this.closed = true;
    this.out = [];
    this.outBytes = 0;
    this.stage = null;
    this.stageFrom = 0;
    this.stageAt = 0;
    for (const w of this.waiters.splice(0)) w();
  }

  private readonly flushSoon = (): void => {
    this.scheduled = false;
    if (!this.blocked) this.flush();
  };

  /** Writes queued chunks, small ones joined, until the socket takes no more. */
  private flush(): void {
    this.sealStage();
    while (this.out.length > 0) {
      let head = this.out[0]!;
      let joined = 1;
      if (head.length < COALESCE_BYTES && this.out.length > 1) {
        let size = head.length;
        while (joined < this.out.length && size + this.out[joined]!.length <= COALESCE_BYTES) size += this.out[joined++]!.length;
        if (joined > 1) {
          const buf = new Uint8Array(size);
          let at = 0;
          for (let i = 0; i < joined; i++) {
            buf.set(this.out[i]!, at);
            at += this.out[i]!.length;
          }
          head = buf;
        }
      }
      const written = Math.max(0, this.write(head));
      if (written < head.length) {
        // Part of it went: the rest stays at the front until the drain callback.
        this.out.splice(0, joined, head.subarray(written));
        this.outBytes -= written;
        this.blocked = true;
        break;
      }
      this.out.splice(0, joined);
      this.outBytes -= head.length;
    }
    // Everything went: no view of the staging buffer is left, so it is filled from its start again.
    if (this.out.length === 0) {
      this.stageFrom = 0;
      this.stageAt = 0;
    }
    if (this.outBytes <= this.highWater) for (const w of this.waiters.splice(0)) w();
  }
}
