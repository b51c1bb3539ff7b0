/**
 * What the sending and receiving halves of federation need of a session:
 * who the peer is, whether it is open, frames out with backpressure, and a
 * way to end it with a reason. A `PeerSession` is one; tests use a fake.
 */
export interface Link {
  readonly peer: { readonly name: string };
  readonly state: "handshaking" | "open" | "closed";
  /** Queues a frame; false when the caller should wait for `writable()` before more. */
  send(frame: Uint8Array): boolean;
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
}

/** What a peer has not acknowledged on one channel. */
export interface ChannelBacklog {
  channel: string;
  messages: number;
  /** Record bytes (headers included) from the peer's cursor on; see ChannelLog#bytesFrom. */
  bytes: number;
}
