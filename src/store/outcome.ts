/**
 * The outcome of one operation that usually completes before its call
 * returns: the caller gets the value itself then, and a promise only when
 * it is still pending. Saves a promise and a microtask on the common path.
 */

/**
 * One record of `ChannelLog.appendNow`, queued as the log's pending entry
 * itself, and how it came out: its seq at once, or a promise of it when it
 * is not settled yet. The log calls `resolve` and `reject` as methods, so a
 * record costs this one object and no closures.
 */
export class Outcome {
  readonly body: Uint8Array;
  /** performance.now() when the append was requested. */
  readonly at: number;
  private seq = -1;
  private error: unknown = undefined;
  private failed = false;
  private settle: { resolve: (seq: number) => void; reject: (err: unknown) => void } | null = null;

  constructor(body: Uint8Array, at: number) {
    this.body = body;
    this.at = at;
  }

  resolve(seq: number): void {
    if (this.settle) this.settle.resolve(seq);
    else this.seq = seq;
  }

  reject(err: unknown): void {
    if (this.settle) this.settle.reject(err);
    else {
      this.failed = true;
      this.error = err;
    }
  }

  /** The seq if the record is settled, else a promise of it. */
  now(): number | Promise<number> {
    if (this.failed) return Promise.reject(this.error);
    return this.seq >= 0 ? this.seq : this.later();
  }

  /** A promise of the seq (settled already or not). */
  later(): Promise<number> {
    if (this.failed) return Promise.reject(this.error);
    if (this.seq >= 0) return Promise.resolve(this.seq);
    return new Promise<number>((resolve, reject) => {
      this.settle = { resolve, reject };
    });
  }
}
