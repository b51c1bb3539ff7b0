/**
 * Mutual-TLS listeners and connections whose application handlers only ever
 * see verified peers. Bytes that arrive before verification finishes are
 * held (at most MAX_EARLY_BYTES) and handed over only if the peer passes; a
 * peer that fails is logged with the reason and its connection closed, and
 * none of its bytes reach the application.
 */
import type { Socket, TCPSocketListener } from "bun";
import type { Logger } from "../observability/logger.ts";
import { PeerRejectedError } from "../errors.ts";
import { bunTlsOptions, verifyPeer, type PeerIdentity, type TlsMaterial } from "./tls.ts";

/** Bytes a peer may send before it is verified. */
export const MAX_EARLY_BYTES = 64 * 1024;
/** A peer that has not completed the handshake by then is dropped. */
export const HANDSHAKE_TIMEOUT_MS = 10_000;

/** Per-connection state. */
export interface MtlsState<T> {
  peer?: PeerIdentity;
  verified: boolean;
  closed?: boolean;
  early: Uint8Array[];
  earlyBytes: number;
  timer?: ReturnType<typeof setTimeout>;
  /** Free for the application. */
  app?: T;
}

/** A socket of a verified (or being verified) mutual-TLS connection. */
export type MtlsSocket<T> = Socket<MtlsState<T>>;

/** What the application does with verified connections. */
export interface MtlsHandler<T> {
  open(socket: MtlsSocket<T>, peer: PeerIdentity): void;
  data(socket: MtlsSocket<T>, chunk: Uint8Array): void;
  close?(socket: MtlsSocket<T>): void;
  drain?(socket: MtlsSocket<T>): void;
}

/** Called for every refused peer (the audit trail hooks in here). */
export type RejectHook = (reason: string, remote: string) => void;

/**
 * What to tell a peer that is refused after the TLS handshake: `unknown`, a
 * valid certificate whose name the application does not accept;
 * `unverified`, a certificate that failed verification.
 */
export type Farewell = (reason: string, why: "unknown" | "unverified") => Uint8Array;

/** Decides whether a verified peer may stay; returns a reason to refuse it, or null. */
export type AuthorizeHook = (peer: PeerIdentity) => string | null;

function socketHandlers<T>(
  expect: "client" | "server",
  material: () => TlsMaterial,
  handler: MtlsHandler<T>,
  logger: Logger,
  onReject?: RejectHook,
  authorize?: AuthorizeHook,
  farewell?: Farewell,
  onEarlyClose?: () => void,
) {
  const reject = (s: MtlsSocket<T>, reason: string, say?: Uint8Array) => {
    logger.warn("tls peer rejected", { remote: s.remoteAddress, reason });
    onReject?.(reason, s.remoteAddress);
    s.data.early = [];
    if (say) {
      s.write(say);
      s.end();
    } else s.terminate();
  };
  // An exception in the application's handlers must not vanish or take the process down:
  // log it and drop that one connection.
  const fail = (s: MtlsSocket<T>, e: unknown) => {
    logger.error("connection handler failed, closing the connection", { remote: s.remoteAddress, peer: s.data.peer?.name, error: e instanceof Error ? (e.stack ?? e.message) : String(e) });
    s.terminate();
  };
  return {
    open(s: MtlsSocket<T>) {
      s.data = { verified: false, early: [], earlyBytes: 0 };
      // Frames are small and latency matters (acks, heartbeats): no Nagle delay.
      s.setNoDelay(true);
      s.data.timer = setTimeout(() => !s.data.verified && reject(s, "handshake timed out"), HANDSHAKE_TIMEOUT_MS);
    },
    handshake(s: MtlsSocket<T>, ok: boolean, err: Error | null) {
      verifyPeer(s, ok, err, material(), expect).then(
        (peer) => {
          clearTimeout(s.data.timer);
          if (s.data.closed) return;
          const refused = authorize?.(peer);
          // A verified peer that is not welcome is told why; one that failed verification is not.
          if (refused) return reject(s, refused, farewell?.(refused, "unknown"));
          s.data.peer = peer;
          try {
            handler.open(s, peer);
            // Only now: bytes that arrive while the application is opening are held, then handed over in order.
            s.data.verified = true;
            const early = s.data.early;
            s.data.early = [];
            for (const chunk of early) handler.data(s, chunk);
          } catch (e) {
            fail(s, e);
          }
        },
        (e) => {
          clearTimeout(s.data.timer);
          const reason = e instanceof PeerRejectedError ? e.message : `verification failed: ${String(e)}`;
          reject(s, reason, farewell?.(reason, "unverified"));
        },
      );
    },
    data(s: MtlsSocket<T>, chunk: Uint8Array) {
      if (s.data.verified) {
        try {
          handler.data(s, chunk);
        } catch (e) {
          fail(s, e);
        }
        return;
      }
      s.data.earlyBytes += chunk.length;
      if (s.data.earlyBytes > MAX_EARLY_BYTES) return reject(s, "too much data before verification");
      s.data.early.push(new Uint8Array(chunk));
    },
    drain(s: MtlsSocket<T>) {
      if (s.data?.verified) handler.drain?.(s);
    },
    close(s: MtlsSocket<T>) {
      if (!s.data) return;
      s.data.closed = true;
      clearTimeout(s.data.timer);
      if (s.data?.verified) handler.close?.(s);
      // Gone before verification (cut mid-handshake): the application never had it open, but a
      // client waiting to reconnect must hear of it now, not at its handshake deadline.
      else onEarlyClose?.();
    },
    error(s: MtlsSocket<T>, err: Error) {
      logger.debug("tls socket error", { remote: s.remoteAddress, error: String(err) });
    },
  };
}

/** Options of `MtlsServer.listen`. */
export interface MtlsServerOptions {
  hostname: string;
  port: number;
  material: TlsMaterial;
  logger: Logger;
  onReject?: RejectHook;
  /** Refuses verified peers the application does not know (e.g. a CN not in hub.peers). */
  authorize?: AuthorizeHook;
  /** Bytes written to a refused peer before the connection ends (the protocol's CLOSE), so it knows retrying is pointless. */
  farewell?: Farewell;
}

/**
 * A mutual-TLS listener. `reload` swaps the certificate, key and CA: new
 * connections use the new material, established ones stay up.
 */
export class MtlsServer<T> {
  private listener: TCPSocketListener<MtlsState<T>>;
  private material: TlsMaterial;
  private readonly opts: MtlsServerOptions;
  private readonly handler: MtlsHandler<T>;

  private constructor(opts: MtlsServerOptions, handler: MtlsHandler<T>) {
    this.opts = opts;
    this.handler = handler;
    this.material = opts.material;
    this.listener = this.listen(opts.port);
  }

  /** Listens on `hostname:port` (port 0: any free port). */
  static listen<T>(opts: MtlsServerOptions, handler: MtlsHandler<T>): MtlsServer<T> {
    return new MtlsServer(opts, handler);
  }

  private listen(port: number): TCPSocketListener<MtlsState<T>> {
    return Bun.listen<MtlsState<T>>({
      hostname: this.opts.hostname,
      port,
      tls: bunTlsOptions(this.material),
      socket: socketHandlers<T>("client", () => this.material, this.handler, this.opts.logger, this.opts.onReject, this.opts.authorize, this.opts.farewell),
    });
  }

  /** The port actually listened on. */
  get port(): number {
    return this.listener.port;
  }

  /** The material in force. */
  get current(): TlsMaterial {
    return this.material;
  }

  /** Uses `material` for connections from now on; existing ones are kept. */
  reload(material: TlsMaterial): void {
    const port = this.listener.port;
    this.listener.stop(false);
    this.material = material;
    this.listener = this.listen(port);
  }

  /** Stops listening; with `closeConnections`, also drops every connection. */
  stop(closeConnections = false): void {
    this.listener.stop(closeConnections);
  }
}

/** Options of `connectMtls`. */
export interface MtlsConnectOptions {
  /** The connection closed before the server was verified (refused, or cut mid-handshake). */
  onEarlyClose?: () => void;
  hostname: string;
  port: number;
  material: TlsMaterial;
  logger: Logger;
  onReject?: RejectHook;
}

/** Connects to a mutual-TLS server; `handler.open` runs once the server is verified. */
export function connectMtls<T>(opts: MtlsConnectOptions, handler: MtlsHandler<T>): Promise<MtlsSocket<T>> {
  return Bun.connect<MtlsState<T>>({
    hostname: opts.hostname,
    port: opts.port,
    tls: { ...bunTlsOptions(opts.material), serverName: opts.hostname },
    socket: socketHandlers<T>("server", () => opts.material, handler, opts.logger, opts.onReject, undefined, undefined, opts.onEarlyClose),
  });
}
