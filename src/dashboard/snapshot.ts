/**
 * What the dashboard page shows, as one JSON value: the agent, the fleet
 * table, channels with their rates (from the counters' change since the
 * last snapshot), the last hour's chart points and the latest audit events.
 */
import type { Federation } from "../federation/federation.ts";
import type { FleetPeer } from "../federation/fleet.ts";
import type { Messenger } from "../messenger/messenger.ts";
import type { History } from "./history.ts";

export interface SnapshotSources {
  messenger: Messenger;
  federation: Federation | undefined;
  history: History;
  agent: () => { name: string; version: string; uptimeS: number; role: string; sync: string; offlineAfterMs: number };
  now?: () => number;
}

/** A row as the page gets it: times, not ages, so that a row that did not change is sent once. */
function fleetJson(p: FleetPeer, now: number): Record<string, unknown> {
  return {
    kind: p.kind,
    name: p.name,
    state: p.state,
    since: p.since,
    last_seen: p.lastSeen,
    rtt_ms: p.rttMs,
    connects: p.connects,
    backlog_messages: p.backlogMessages,
    backlog_bytes: p.backlogBytes,
    oldest_unsent_at: p.oldestAgeMs === null ? null : now - p.oldestAgeMs,
    cert_not_after: p.certNotAfter,
    last_error: p.lastError,
    configured: p.configured,
  };
}

export class SnapshotBuilder {
  private prev = new Map<string, { published: number; delivered: number }>();
  private prevAt = 0;

  constructor(private readonly s: SnapshotSources) {}

  async build(): Promise<Record<string, unknown>> {
    const now = (this.s.now ?? Date.now)();
    const st = this.s.messenger.stats();
    const dt = this.prevAt > 0 ? (now - this.prevAt) / 1000 : 0;
    const next = new Map<string, { published: number; delivered: number }>();
    const channels = st.channels.map((c) => {
      const before = this.prev.get(c.channel);
      next.set(c.channel, { published: c.published, delivered: c.delivered });
      const rate = (a: number, b: number | undefined) => (dt > 0 && b !== undefined ? Math.max(0, (a - b) / dt) : 0);
      return {
        channel: c.channel,
        messages: c.messages,
        bytes: c.bytes,
        publish_per_s: rate(c.published, before?.published),
        delivery_per_s: rate(c.delivered, before?.delivered),
        subscribers: c.subscribers.filter((x) => !x.name.startsWith("_fed.")).map((x) => ({ name: x.name, lag: x.lag })),
      };
    });
    this.prev = next;
    this.prevAt = now;
    const a = this.s.agent();
    return {
      agent: { name: a.name, version: a.version, uptime_s: a.uptimeS, role: a.role, sync: a.sync, offline_after_ms: a.offlineAfterMs },
      fleet: this.s.federation ? (await this.s.federation.fleet(now)).map((p) => fleetJson(p, now)) : [],
      channels,
      history: this.s.history.all().map((p) => ({
        t: p.t,
        ingest_per_s: p.ingestPerS,
        disk_p50_ms: p.diskP50Ms,
        disk_p99_ms: p.diskP99Ms,
        handler_p50_ms: p.handlerP50Ms,
        handler_p99_ms: p.handlerP99Ms,
        fsync_p50_ms: p.fsyncP50Ms,
        fsync_p99_ms: p.fsyncP99Ms,
      })),
      audit: (this.s.federation?.recentAudit() ?? []).slice(-200),
    };
  }
}
