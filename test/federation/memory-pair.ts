/**
 * Two federation sessions joined by an in-memory pipe instead of TLS: bytes
 * arrive on a later microtask as on a socket, a side can be made silent (a
 * path that drops everything without a FIN), and a side's writes can be
 * limited so that the rest waits for its drain.
 */
import { PeerSession, type SessionEvents, type SessionOptions, type SessionTransport } from "../../src/federation/session.ts";
import { silentLogger } from "../../src/observability/logger.ts";

/** One end of the pipe. */
export interface PipeEnd extends SessionTransport {
  /** Drop everything written from this end (no FIN). */
  silent: boolean;
  /** Most bytes one write takes (the rest waits for `drain()`). */
  capacity: number;
  /** Bytes written from this end and taken. */
  written: number;
  /** The end's transport has room again: tells its session. */
  drain(): void;
  ended: boolean;
}

const identity = (name: string) => ({ name, fingerprint: `fp-${name}`, notAfter: new Date(Date.now() + 86_400_000) });

/** A client session and a hub session on one pipe; `hubEvents` decide the handshake. */
export function sessionPair(
  clientEvents: SessionEvents,
  hubEvents: SessionEvents,
  opts: Partial<SessionOptions> = {},
  sides: { client?: Partial<SessionOptions>; hub?: Partial<SessionOptions> } = {},
): { client: PeerSession; hub: PeerSession; clientEnd: PipeEnd; hubEnd: PipeEnd } {
  let client: PeerSession | null = null;
  let hub: PeerSession | null = null;
  const end = (from: () => PeerSession | null, to: () => PeerSession | null): PipeEnd => {
    const e: PipeEnd = {
      silent: false,
      capacity: Number.POSITIVE_INFINITY,
      written: 0,
      ended: false,
      write(bytes) {
        if (e.ended) return -1;
        const n = Math.min(bytes.length, e.capacity);
        e.written += n;
        if (!e.silent) {
          const copy = bytes.slice(0, n);
          queueMicrotask(() => to()?.receive(copy));
        }
        return n;
      },
      end() {
        if (e.ended) return;
        e.ended = true;
        queueMicrotask(() => {
          from()?.transportClosed();
          // A silent path carries no FIN either.
          if (!e.silent) to()?.transportClosed();
        });
      },
      terminate() {
        e.end();
      },
      drain() {
        from()?.drained();
      },
    };
    return e;
  };
  const clientEnd = end(
    () => client,
    () => hub,
  );
  const hubEnd = end(
    () => hub,
    () => client,
  );
  const base = { maxBody: 1 << 20, heartbeatMs: 5_000, logger: silentLogger, ...opts };
  client = new PeerSession(clientEnd, identity("hub"), { ...base, ...sides.client, role: "client" }, clientEvents);
  hub = new PeerSession(hubEnd, identity("dev"), { ...base, ...sides.hub, role: "hub" }, hubEvents);
  return { client, hub, clientEnd, hubEnd };
}
