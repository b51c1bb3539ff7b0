/**
 * What a hub or device keeps about its peers across restarts, from the log
 * and the cursors: the ids of recent records (so a batch resent after a
 * crash is not stored twice) and the federation cursors of peers gone for
 * good (removed, so they stop pinning retention).
 */
import { envelopeId, scanEnvelope } from "../envelope/scan.ts";
import type { Messenger } from "../messenger/messenger.ts";
import type { Logger } from "../observability/logger.ts";
import type { RecentIds } from "./dedup.ts";

/** Most ids loaded per channel. */
const PER_CHANNEL = 10_000;

/**
 * Fills the duplicate filter with the ids of the newest records of every
 * channel (up to its capacity in all, at most 10,000 per channel). The
 * filter lives in memory; without this, a batch that was stored just
 * before a crash but not yet acknowledged would be stored a second time
 * when the sender resends it after the restart. Returns the ids loaded.
 */
export async function seedDuplicateFilter(messenger: Messenger, dedup: RecentIds): Promise<number> {
  const logs = messenger.channelLogs();
  if (logs.length === 0 || dedup.capacity === 0) return 0;
  const per = Math.min(PER_CHANNEL, Math.max(1, Math.floor(dedup.capacity / logs.length)));
  let loaded = 0;
  for (const log of logs) {
    let from = Math.max(log.firstSeq, log.nextSeq - per);
    while (from < log.nextSeq) {
      const recs = await log.read(from, 1000);
      if (recs.length === 0) break;
      for (const r of recs) {
        try {
          dedup.seen(envelopeId(r.body, scanEnvelope(r.body)));
          loaded++;
        } catch {
          // not an envelope: nothing to remember
        }
      }
      from = recs[recs.length - 1]!.seq + 1;
    }
  }
  return loaded;
}

/**
 * Removes the federation cursors (`_fed.<peer>`) of peers not `connected`
 * and not seen for `expiryMs`, so a board that is gone for good stops
 * pinning retention. Returns the removed subscribers.
 */
export async function removeExpiredPeerCursors(messenger: Messenger, connected: ReadonlySet<string>, expiryMs: number, now: number, logger: Logger): Promise<string[]> {
  const removed: string[] = [];
  for (const s of messenger.subscribers()) {
    if (!s.name.startsWith("_fed.")) continue;
    const peer = s.name.slice("_fed.".length);
    if (connected.has(peer) || now - s.touched <= expiryMs) continue;
    if (await messenger.deleteSubscriber(s.pattern, s.name)) {
      removed.push(`${s.name} on ${s.pattern}`);
      logger.warn("removed the federation cursor of a peer gone too long", { peer, pattern: s.pattern, last_seen: new Date(s.touched).toISOString() });
    }
  }
  return removed;
}
