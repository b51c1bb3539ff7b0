/**
 * The newest committed records of one channel, kept in memory (up to a
 * byte budget) so that a reader keeping up is served without a read of the
 * segment. Filled only while someone reads: holding the last megabyte of
 * records for nobody was not free, since every record kept past the young
 * generation becomes old garbage for the full collections (docs/benchmarks.md).
 */
import { RECORD_HEADER_BYTES, type RawRecord } from "./record.ts";

/** A reader idle this long (ms) no longer keeps the cache filled. */
const IDLE_MS = 2_000;

interface Cached extends RawRecord {
  /** performance.now() when the append was requested (latency metrics). */
  at: number;
}

/** Contiguous newest records of one channel. */
export class TailCache {
  private readonly maxBytes: number;
  private recs: Cached[] = [];
  private head = 0;
  private bytes = 0;
  /** performance.now() of the last read. */
  private lastReadAt = Number.NEGATIVE_INFINITY;

  constructor(maxBytes: number) {
    this.maxBytes = maxBytes;
  }

  /**
   * Whether commits should go to the cache now: while a reader waits for
   * commits (`watched`: a subscription, a forwarder, a long poll) or has
   * read within the last two seconds. Otherwise the cache is emptied, and
   * restarts, contiguous, at the next commit it takes.
   */
  wanted(watched: boolean): boolean {
    const want = this.maxBytes > 0 && (watched || performance.now() - this.lastReadAt < IDLE_MS);
    if (!want && this.recs.length > 0) {
      this.recs = [];
      this.head = 0;
      this.bytes = 0;
    }
    return want;
  }

  /** Adds the next record (its seq follows the last one's). */
  push(seq: number, body: Uint8Array, at: number): void {
    this.recs.push({ seq, body, at });
    this.bytes += body.length;
    while (this.bytes > this.maxBytes && this.head < this.recs.length - 1) {
      this.bytes -= this.recs[this.head]!.body.length;
      this.recs[this.head] = undefined as unknown as Cached;
      this.head++;
    }
    if (this.head > 4096 && this.head * 2 > this.recs.length) {
      this.recs = this.recs.slice(this.head);
      this.head = 0;
    }
  }

  /** A read is starting (it keeps the cache wanted). */
  noteRead(): void {
    this.lastReadAt = performance.now();
  }

  /** Records from `from` on, at most `maxCount` and about `maxBytes`; null when `from` is older than the cache. */
  read(from: number, maxCount: number, maxBytes: number): RawRecord[] | null {
    const n = this.recs.length - this.head;
    if (n === 0) return null;
    const first = this.recs[this.head]!.seq;
    if (from < first) return null;
    const out: RawRecord[] = [];
    let bytes = 0;
    for (let i = this.head + (from - first); i < this.recs.length && out.length < maxCount && bytes < maxBytes; i++) {
      const r = this.recs[i]!;
      out.push({ seq: r.seq, body: r.body });
      bytes += r.body.length + RECORD_HEADER_BYTES;
    }
    return out;
  }

  /** When the append of `seq` was requested; undefined once it left the cache. */
  appendedAt(seq: number): number | undefined {
    const n = this.recs.length - this.head;
    if (n === 0) return undefined;
    const first = this.recs[this.head]!.seq;
    if (seq < first || seq >= first + n) return undefined;
    return this.recs[this.head + (seq - first)]!.at;
  }
}
