/**
 * The last hour of an agent's figures for the dashboard's charts, one
 * point every 10 s: messages stored per second, and the p50 and p99 of
 * publish-to-disk, publish-to-handler and fsync latency over each interval
 * (from the difference of the cumulative histograms, not since start).
 */
import type { Histogram } from "../observability/histogram.ts";

/** One point of the charts. */
export interface HistoryPoint {
  /** Epoch seconds. */
  t: number;
  ingestPerS: number;
  diskP50Ms: number | null;
  diskP99Ms: number | null;
  handlerP50Ms: number | null;
  handlerP99Ms: number | null;
  fsyncP50Ms: number | null;
  fsyncP99Ms: number | null;
}

/** What the sampler reads. */
export interface HistorySource {
  published(): number;
  histograms(): { publishToDisk: Histogram; publishToHandler: Histogram; fsync: Histogram };
}

export const HISTORY_EVERY_MS = 10_000;
export const HISTORY_POINTS = 360;

/** Quantile `q` of what a histogram recorded since `before` (bucket counts), or null when nothing was. */
export function intervalQuantile(h: Histogram, before: Float64Array, q: number, bound: (i: number) => number): number | null {
  const now = h.bucketCounts();
  let n = 0;
  for (let i = 0; i < now.length; i++) n += now[i]! - (before[i] ?? 0);
  if (n <= 0) return null;
  const target = Math.max(1, Math.ceil(q * n));
  let seen = 0;
  for (let i = 0; i < now.length; i++) {
    seen += now[i]! - (before[i] ?? 0);
    if (seen >= target) return bound(i);
  }
  return bound(now.length - 1);
}

export class History {
  private readonly points: HistoryPoint[] = [];
  private last: { t: number; published: number; disk: Float64Array; handler: Float64Array; fsync: Float64Array } | null = null;
  private timer: ReturnType<typeof setInterval> | null = null;

  constructor(
    private readonly source: HistorySource,
    private readonly bound: (i: number) => number,
    private readonly now: () => number = () => Date.now(),
  ) {}

  /** Samples every `everyMs` until `stop`. */
  start(everyMs = HISTORY_EVERY_MS): void {
    this.sample();
    this.timer = setInterval(() => this.sample(), everyMs);
    this.timer.unref?.();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** Takes one point (the first call only sets the baseline). */
  sample(): void {
    const t = this.now();
    const h = this.source.histograms();
    const cur = { t, published: this.source.published(), disk: h.publishToDisk.bucketCounts(), handler: h.publishToHandler.bucketCounts(), fsync: h.fsync.bucketCounts() };
    const prev = this.last;
    this.last = cur;
    if (!prev || t <= prev.t) return;
    const q = (hist: Histogram, before: Float64Array, x: number) => intervalQuantile(hist, before, x, this.bound);
    this.points.push({
      t: Math.round(t / 1000),
      ingestPerS: ((cur.published - prev.published) * 1000) / (t - prev.t),
      diskP50Ms: q(h.publishToDisk, prev.disk, 0.5),
      diskP99Ms: q(h.publishToDisk, prev.disk, 0.99),
      handlerP50Ms: q(h.publishToHandler, prev.handler, 0.5),
      handlerP99Ms: q(h.publishToHandler, prev.handler, 0.99),
      fsyncP50Ms: q(h.fsync, prev.fsync, 0.5),
      fsyncP99Ms: q(h.fsync, prev.fsync, 0.99),
    });
    if (this.points.length > HISTORY_POINTS) this.points.splice(0, this.points.length - HISTORY_POINTS);
  }

  /** The points, oldest first. */
  all(): readonly HistoryPoint[] {
    return this.points;
  }
}
