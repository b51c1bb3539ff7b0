/**
 * Per channel pattern: a default time to live for what is published there,
 * and a bound on what the channel's log holds with what to do when it is
 * full (docs/config.md `channels`). The first entry whose pattern matches a
 * channel applies to it.
 *
 * - `reject`: a publish that would take the log past `max_bytes` first lets
 *   go of what every subscriber and link has acknowledged; if that is not
 *   enough it is refused (`buffer_full`, HTTP 507), and the publisher keeps
 *   its data.
 * - `drop_oldest`: the oldest messages go, read or not.
 * - `latest`: a link sends only the newest message of the channel that it
 *   has not acknowledged (a device's state): while the link is down the
 *   rest are passed over for it. The log itself is bounded as with
 *   `drop_oldest` when `max_bytes` is set.
 */
import { compilePattern } from "../envelope/names.ts";

/** What happens when a channel is full, or (latest) what a link keeps. */
export type FullPolicy = "reject" | "drop_oldest" | "latest";

/** One `channels` entry. */
export interface ChannelPolicy {
  pattern: string;
  /** Default time to live of messages published on the channel (ms). */
  ttlMs?: number | undefined;
  /** Most bytes the channel's log holds. */
  maxBytes?: number | undefined;
  fullPolicy?: FullPolicy | undefined;
}

/** The policy that applies to one channel. */
export interface AppliedPolicy {
  ttlMs: number | undefined;
  maxBytes: number | undefined;
  fullPolicy: FullPolicy;
}

const NONE: AppliedPolicy = { ttlMs: undefined, maxBytes: undefined, fullPolicy: "drop_oldest" };

/** The policy of each channel, looked up once per channel. */
export class ChannelPolicies {
  private readonly rules: { match: (channel: string) => boolean; applied: AppliedPolicy }[];
  private readonly cache = new Map<string, AppliedPolicy>();

  constructor(policies: readonly ChannelPolicy[] = []) {
    this.rules = policies.map((p) => ({ match: compilePattern(p.pattern), applied: { ttlMs: p.ttlMs, maxBytes: p.maxBytes, fullPolicy: p.fullPolicy ?? "drop_oldest" } }));
  }

  /** Whether any entry is configured (a messenger without any skips every check). */
  get empty(): boolean {
    return this.rules.length === 0;
  }

  /** The policy of `channel` (no TTL, no bound when no entry matches). */
  of(channel: string): AppliedPolicy {
    if (this.rules.length === 0) return NONE;
    let p = this.cache.get(channel);
    if (!p) {
      p = this.rules.find((r) => r.match(channel))?.applied ?? NONE;
      if (this.cache.size > 10_000) this.cache.clear();
      this.cache.set(channel, p);
    }
    return p;
  }

  /**
   * Segment size for a bounded channel: an eighth of its bound (at least
   * 4 KiB, at most the store's), so that the log can let go of its oldest
   * part without dropping most of what it holds.
   */
  segmentBytes(channel: string, storeSegmentBytes: number): number {
    const max = this.of(channel).maxBytes;
    if (max === undefined) return storeSegmentBytes;
    return Math.min(storeSegmentBytes, Math.max(4096, Math.floor(max / 8)));
  }
}
