/**
 * What the sending and receiving halves of federation need of a session:
 * who the peer is, whether it is open, frames out with backpressure, and a
 * way to end it with a reason. A `PeerSession` is one; tests use a fake.
 */
import type { LaneStats } from "./lanes.ts";

export interface Link {
  readonly peer: { readonly name: string };
  readonly state: "handshaking" | "open" | "closed";
  /** Queues a frame (with `now`, writes it in the call); false when the caller should wait for `writable()` before more. */
  send(frame: Uint8Array, now?: boolean): boolean;
  /** The bytes to send for a data frame (compressed when the session agreed on a codec). */
  pack(frame: Uint8Array): Uint8Array;
  /** Times the connection had been full and took bytes again (the stall watchdog's sign of a slow path). */
  readonly drains?: number;
  /** Resolves when the transport has room again. */
  writable(): Promise<void>;
  /** Sends CLOSE with `code` and `reason` and ends the session. */
  close(code: string, reason: string): void;
}

/** A link or hub peer as status and metrics show it. */
export interface LinkInfo {
  kind: "link" | "peer" | "ephemeral";
  /** host:port for links, CN for hub peers. */
  target: string;
  state: "connecting" | "open" | "backoff";
  peer: string | null;
  /** Epoch ms the open session started. */
  connectedSince: number | null;
  reconnects: number;
  rttMs: number | null;
  unackedBatches: number;
  /** Messages this side stored from the peer since start. */
  stored: number;
  /** Per channel: messages waiting to be acknowledged by the peer. */
  backlog: ChannelBacklog[];
  lastError: string | null;
  /** The codec the open session agreed on, if any. */
  compression: string | null;
  /** BATCH bytes of the open session, as encoded and on the wire. */
  wire: { sentRaw: number; sentWire: number; receivedRaw: number; receivedWire: number } | null;
  /** The open session's lanes towards the peer. */
  lanes: LaneStats[];
  /** Cap on data bytes per second towards the peer, if any. */
  maxBytesPerS: number | null;
  /** What the peer has not acknowledged, per priority lane (from `backlog`). */
  laneBacklog: LaneBacklog[];
  /** Sessions the stall watchdog ended since start (acknowledgements stopped while the link looked alive). */
  stalls: number;
}

/** What a peer has not acknowledged on one channel. */
export interface ChannelBacklog {
  channel: string;
  /** First seq not acknowledged (the lowest cursor over the patterns). */
  from: number;
  messages: number;
  /** Record bytes (headers included) from the peer's cursor on; see ChannelLog#bytesFrom. */
  bytes: number;
  /** Age of the oldest message not acknowledged, ms, when sampled (health.ts). */
  oldestAgeMs?: number | null;
}

/** What a lane holds that the peer has not acknowledged. */
export interface LaneBacklog {
  priority: number;
  messages: number;
  /** Age of its oldest unacknowledged message, ms (null: nothing waits). */
  oldestAgeMs: number | null;
}
