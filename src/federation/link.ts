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
