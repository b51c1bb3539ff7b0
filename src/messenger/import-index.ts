/**
 * The ids a channel's log holds, for `keyop import`: an imported message
 * whose id is there already is a duplicate and is dropped. Built by one
 * read of the log (ids are found by scanning, not decoding) the first time
 * an import touches the channel, kept up to date while imports go on, and
 * forgotten when no import used it for a minute, so an agent pays for it
 * only while someone imports.
 */
import { envelopeId, scanEnvelope } from "../envelope/scan.ts";
import type { ChannelLog } from "../store/channel-log.ts";

/** How long an index is kept after the last import that used it (ms). */
export const IMPORT_INDEX_IDLE_MS = 60_000;

interface Entry {
  ids: Set<string>;
  /** Records before this seq are in `ids`. */
  upTo: number;
  used: number;
}

export class ImportIndex {
  private readonly entries = new Map<string, Entry>();

  constructor(private readonly now: () => number = () => performance.now()) {}

  /** The ids in `log`, through its last record. */
  async idsOf(log: ChannelLog): Promise<Set<string>> {
    const now = this.now();
    for (const [name, e] of this.entries) if (now - e.used > IMPORT_INDEX_IDLE_MS) this.entries.delete(name);
    let e = this.entries.get(log.name);
    if (!e) {
      e = { ids: new Set(), upTo: log.firstSeq, used: now };
      this.entries.set(log.name, e);
    }
    e.used = now;
    // What was appended since (imports, publishes) is read too.
    while (e.upTo < log.nextSeq) {
      const recs = await log.read(Math.max(e.upTo, log.firstSeq), 4096, 8 << 20);
      if (recs.length === 0) break;
      for (const r of recs) {
        try {
          e.ids.add(envelopeId(r.body, scanEnvelope(r.body)));
        } catch {
          // not an envelope: it has no id to collide with
        }
      }
      e.upTo = recs[recs.length - 1]!.seq + 1;
    }
    return e.ids;
  }

  /** Channels with an index now. */
  get size(): number {
    return this.entries.size;
  }
}
