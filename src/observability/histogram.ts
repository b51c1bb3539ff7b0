/**
 * A fixed-memory latency histogram with log-spaced buckets.
 *
 * Publish and delivery latencies are recorded on hot paths, so recording is
 * one Math.log and an array increment; percentiles are read rarely. Bucket
 * bounds double every 8 buckets (~9% resolution) from 1 µs to ~1.2 h.
 */

const PER_DOUBLING = 8;
const MIN_MS = 0.001;
const BUCKETS = PER_DOUBLING * 32;
const LOG_STEP = Math.log(2) / PER_DOUBLING;

/** Percentile summary, all in milliseconds. */
export interface LatencySummary {
  count: number;
  p50: number;
  p90: number;
  p99: number;
  p999: number;
  max: number;
  mean: number;
}

/** Records durations in ms and reports percentiles. */
export class Histogram {
  private counts = new Float64Array(BUCKETS);
  private n = 0;
  private sum = 0;
  private maxSeen = 0;

  /** Records one duration in milliseconds. */
  record(ms: number): void {
    if (!(ms >= 0)) return;
    const i = ms <= MIN_MS ? 0 : Math.min(BUCKETS - 1, Math.ceil(Math.log(ms / MIN_MS) / LOG_STEP));
    this.counts[i]!++;
    this.n++;
    this.sum += ms;
    if (ms > this.maxSeen) this.maxSeen = ms;
  }

  /** Upper bound (ms) of bucket `i`. */
  static bound(i: number): number {
    return MIN_MS * Math.exp(i * LOG_STEP);
  }

  /** The value below which fraction `q` of recorded durations fall. */
  quantile(q: number): number {
    if (this.n === 0) return 0;
    const target = Math.max(1, Math.ceil(q * this.n));
    let seen = 0;
    for (let i = 0; i < BUCKETS; i++) {
      seen += this.counts[i]!;
      if (seen >= target) return Math.min(Histogram.bound(i), this.maxSeen);
    }
    return this.maxSeen;
  }

  /** Count, mean, max and the usual percentiles. */
  summary(): LatencySummary {
    return {
      count: this.n,
      p50: this.quantile(0.5),
      p90: this.quantile(0.9),
      p99: this.quantile(0.99),
      p999: this.quantile(0.999),
      max: this.maxSeen,
      mean: this.n ? this.sum / this.n : 0,
    };
  }

  /**
   * Cumulative counts at the given upper bounds (ms), for the Prometheus
   * exposition; each count is exact to the histogram's bucket resolution.
   */
  cumulative(boundsMs: readonly number[]): { le: number; count: number }[] {
    const out: { le: number; count: number }[] = [];
    let i = 0;
    let seen = 0;
    for (const le of boundsMs) {
      while (i < BUCKETS && Histogram.bound(i) <= le * (1 + 1e-9)) seen += this.counts[i++]!;
      out.push({ le, count: seen });
    }
    return out;
  }

  /** A copy of the bucket counts (bucket `i` ends at `Histogram.bound(i)` ms). */
  bucketCounts(): Float64Array {
    return this.counts.slice();
  }

  /** Total recorded and their sum (ms). */
  get count(): number {
    return this.n;
  }
  get total(): number {
    return this.sum;
  }
}
