/**
 * A token bucket in bytes, for a link's bandwidth cap. A frame may go once
 * the bucket is not in debt and takes its whole size (the bucket may go
 * below zero), so frames are never split and the long-run rate is the cap.
 * Pure: the caller passes the clock.
 */
export class TokenBucket {
  readonly rate: number;
  readonly burst: number;
  private tokens: number;
  private at: number;

  /** `rate` bytes per second, at most `burst` saved up while idle; full at `now` (ms). */
  constructor(rate: number, burst: number, now: number) {
    if (!(rate > 0) || !(burst > 0)) throw new RangeError("rate and burst must be positive");
    this.rate = rate;
    this.burst = burst;
    this.tokens = burst;
    this.at = now;
  }

  private refill(now: number): void {
    if (now > this.at) {
      this.tokens = Math.min(this.burst, this.tokens + ((now - this.at) * this.rate) / 1000);
      this.at = now;
    }
  }

  /** Milliseconds from `now` until the next frame may go (0: now). */
  waitMs(now: number): number {
    this.refill(now);
    return this.tokens >= 0 ? 0 : (-this.tokens * 1000) / this.rate;
  }

  /** A frame of `bytes` went out at `now`. */
  take(bytes: number, now: number): void {
    this.refill(now);
    this.tokens -= bytes;
  }
}
