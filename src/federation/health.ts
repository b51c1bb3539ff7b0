/**
 * Link health that does not depend on the link looking alive: how old the
 * oldest message a peer has not acknowledged is (per channel, and per lane),
 * read from the durable cursors, so a link that is down shows it too.
 * Reading a record's time takes a read of the log, so the ages are sampled
 * before status and metrics are rendered, not kept up to date per message.
 */
import { decodeEnvelope } from "../envelope/envelope.ts";
import type { Messenger } from "../messenger/messenger.ts";
import type { ChannelBacklog, LaneBacklog } from "./link.ts";

/**
 * Publish times of the first unacknowledged record of each backlog, by
 * channel and seq: a record's time never changes, so an entry stays true
 * for as long as the cursor sits there.
 */
export class OldestTimes {
  private times = new Map<string, number>();

  private static key(channel: string, seq: number): string {
    return `${channel}\u0000${seq}`;
  }

  /** Reads the times of the backlogs not known yet; forgets the rest. */
  async sample(messenger: Messenger, backlogs: readonly ChannelBacklog[]): Promise<void> {
    const next = new Map<string, number>();
    for (const b of backlogs) {
      if (b.messages === 0) continue;
      const k = OldestTimes.key(b.channel, b.from);
      let t = this.times.get(k);
      if (t === undefined) {
        const log = messenger.channelLog(b.channel);
        const [r] = log ? await log.read(b.from, 1).catch(() => []) : [];
        if (!r) continue;
        try {
          t = decodeEnvelope(r.body, r.seq).ts;
        } catch {
          continue; // not an envelope: the reader skips it too
        }
      }
      next.set(k, t);
    }
    this.times = next;
  }

  /** Publish time of the oldest message of `b` not acknowledged, if sampled. */
  of(b: ChannelBacklog): number | undefined {
    return b.messages > 0 ? this.times.get(OldestTimes.key(b.channel, b.from)) : undefined;
  }
}

/** Backlogs with their age filled in, and grouped by lane. */
export function withAges(backlog: ChannelBacklog[], times: OldestTimes, laneOf: (channel: string) => number, now: number): { backlog: ChannelBacklog[]; lanes: LaneBacklog[] } {
  const lanes = new Map<number, LaneBacklog>();
  for (const b of backlog) {
    const t = times.of(b);
    b.oldestAgeMs = t === undefined ? null : Math.max(0, now - t);
    const p = laneOf(b.channel);
    const lane = lanes.get(p) ?? { priority: p, messages: 0, oldestAgeMs: null };
    lane.messages += b.messages;
    if (b.oldestAgeMs !== null) lane.oldestAgeMs = Math.max(lane.oldestAgeMs ?? 0, b.oldestAgeMs);
    lanes.set(p, lane);
  }
  return { backlog, lanes: [...lanes.values()].sort((a, b) => a.priority - b.priority) };
}

export type { LaneBacklog };
