/**
 * The fleet as an operator's table shows it: every peer a hub knows (the
 * configured ones, those connected now, and those whose cursors remain
 * from earlier sessions) and every link of this instance, each with its
 * state, when it was last seen, its round trip, how often it connected,
 * what this instance holds for it and how old the oldest of that is, and
 * when its certificate expires.
 */

/** One row of the fleet table. */
export interface FleetPeer {
  /** `peer`, `ephemeral` (hub side) or `link` (this instance's own link to a hub). */
  kind: "peer" | "ephemeral" | "link";
  /** The peer's name (CN); for a link that never connected, its hub address. */
  name: string;
  state: "open" | "connecting" | "backoff" | "offline";
  /** Connected since (open), or last seen (otherwise), epoch ms; null when never seen. */
  since: number | null;
  lastSeen: number | null;
  rttMs: number | null;
  /** Sessions since this instance started (a link: reconnects). */
  connects: number;
  /** What this instance holds for it and it has not acknowledged. */
  backlogMessages: number;
  backlogBytes: number;
  oldestAgeMs: number | null;
  certNotAfter: number | null;
  lastError: string | null;
  /** In hub.peers (a peer connected or left over from earlier configuration is not). */
  configured: boolean;
}

/** What a hub remembers of a peer's sessions since it started. */
export interface PeerSeen {
  lastSeenMs: number;
  connects: number;
  certNotAfter: number | null;
  lastReason: string | null;
  ephemeral: boolean;
}
