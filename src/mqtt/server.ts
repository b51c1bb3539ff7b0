/**
 * The MQTT listener: MQTT 3.1.1 and 5.0 on a TCP address, a Unix socket,
 * TLS (a client certificate signed by the keyop CA logs in as its CN), and
 * WebSocket (plain or over TLS), one MqttSession per connection whatever
 * the transport. The session rules are keyop's (src/mqtt/session.ts).
 */
import type { Server, ServerWebSocket, Socket, TCPSocketListener, UnixSocketListener } from "bun";
import { bunOptionalClientCertOptions, verifyPeer, type TlsMaterial } from "../pki/tls.ts";
import type { MqttConfig, MqttUser } from "../config/schema.ts";
import type { Messenger } from "../messenger/messenger.ts";
import type { Logger } from "../observability/logger.ts";
import { prepareSocketPath } from "../net/socket-file.ts";
import { MqttSession, queueWire, sessionName, sharedGroupName, type SessionHost } from "./session.ts";
import { SharedSubscriptions } from "./shared.ts";
import { RetainedStore } from "./retained.ts";
import { SessionStore } from "./session-store.ts";
import { join } from "node:path";
import { CopyBlocks } from "../bytes.ts";
import { OutQueue } from "../net/out-queue.ts";

interface Conn {
  session?: MqttSession;
  out: OutQueue;
  /** TLS: what the client sent before its certificate was checked (no session yet). */
  early?: Uint8Array[];
  earlyBytes?: number;
}

/** A WebSocket connection's state. */
interface WsConn {
  session?: MqttSession;
  out?: OutQueue;
  waiters: (() => void)[];
}

/** Bytes a TLS client may send before its certificate is checked. */
const MAX_EARLY_BYTES = 64 * 1024;

function splitHostPort(hostPort: string): { hostname: string; port: number } {
  const i = hostPort.lastIndexOf(":");
  return { hostname: hostPort.slice(0, i).replace(/^\[|\]$/g, ""), port: Number(hostPort.slice(i + 1)) };
}

/** How often expired persistent sessions are looked for (a session's own expiry also sets a timer). */
const SWEEP_EVERY_MS = 60_000;

/** Bytes queued for one client above which its deliveries wait (see Delivery). */
export const CLIENT_HIGH_WATER_BYTES = 1 << 20;

/** A running MQTT listener. */
export class MqttServer implements SessionHost {
  readonly messenger: Messenger;
  readonly cfg: MqttConfig;
  readonly logger: Logger;
  private tcp: TCPSocketListener<Conn> | null = null;
  private unix: UnixSocketListener<Conn> | null = null;
  private tlsListener: TCPSocketListener<Conn> | null = null;
  private ws: Server<WsConn> | null = null;
  private wss: Server<WsConn> | null = null;
  private wsSockets = new Set<ServerWebSocket<WsConn>>();
  private tls: TlsMaterial | undefined;
  private readonly clients = new Map<string, MqttSession>();
  private readonly sockets = new Set<Socket<Conn>>();
  readonly retained: RetainedStore;
  readonly sessions: SessionStore;
  readonly shared: SharedSubscriptions;
  readonly inbound = new CopyBlocks();
  /** Set by the agent when it has federation links or a hub (see `SessionHost.forwards`). */
  forwards = false;
  private sweeper: ReturnType<typeof setInterval> | null = null;

  private constructor(messenger: Messenger, cfg: MqttConfig, logger: Logger, retained: RetainedStore, sessions: SessionStore) {
    this.messenger = messenger;
    this.cfg = cfg;
    this.logger = logger;
    this.retained = retained;
    this.sessions = sessions;
    this.shared = new SharedSubscriptions(
      messenger.queues,
      (group, pattern) => messenger.openSubscriber(pattern, sharedGroupName(group), { from: "latest" }),
      (group, pattern) => messenger.deleteSubscriber(pattern, sharedGroupName(group)),
      (err) => logger.warn("mqtt shared subscription failed", { error: String(err) }),
    );
  }

  /** Starts listening on what `cfg` names; retained messages live under `dataDir`. */
  static async start(messenger: Messenger, cfg: MqttConfig, logger: Logger, dataDir: string, tls?: TlsMaterial): Promise<MqttServer> {
    const lastSeqs = new Map(messenger.channelLogs().map((l) => [l.name, l.nextSeq - 1]));
    const sessions = await SessionStore.open(join(dataDir, "mqtt-sessions"), lastSeqs, logger);
    const s = new MqttServer(messenger, cfg, logger, await RetainedStore.open(join(dataDir, "mqtt-retained")), sessions);
    // Persistent sessions from before keyop kept their lifetimes: one it knows nothing of
    // (written by a version without expiry) gets the configured one from now.
    for (const sub of messenger.subscribers()) {
      const id = sub.name.startsWith("mqtt.") ? sub.name.slice("mqtt.".length) : undefined;
      if (id && !sessions.knows(id)) await sessions.disconnected(id, cfg.sessionExpiryMs);
    }
    // Shared subscriptions persistent sessions hold while away; a group's subscriber nobody holds
    // (its members' clean sessions ended with a crash) would pin retention for ever: it goes.
    for (const [client, key] of sessions.allRemembered()) if (key.startsWith("$share/")) s.shared.hold(client, key.slice("$share/".length));
    for (const sub of messenger.subscribers()) {
      if (!/^mqtt-share[.-]/.test(sub.name)) continue;
      const held = sessions
        .allRemembered()
        .some(
          ([, key]) =>
            key.startsWith("$share/") &&
            sharedGroupName(SharedSubscriptions.parts(key.slice("$share/".length))[0]) === sub.name &&
            SharedSubscriptions.parts(key.slice("$share/".length))[1] === sub.pattern,
        );
      if (!held) await messenger.deleteSubscriber(sub.pattern, sub.name).catch((err) => logger.warn("mqtt shared subscription's subscriber not deleted", { pattern: sub.pattern, error: String(err) }));
    }
    await s.sweep();
    s.sweeper = setInterval(() => void s.sweep(), SWEEP_EVERY_MS);
    s.sweeper.unref?.();
    s.tls = tls;
    const handlers = s.handlers(false);
    if (cfg.listen) {
      s.tcp = Bun.listen<Conn>({ ...splitHostPort(cfg.listen), socket: handlers });
      logger.info("mqtt listening", { listen: `${splitHostPort(cfg.listen).hostname}:${s.tcp.port}` });
    }
    if (cfg.tlsListen && tls) {
      s.tlsListener = s.listenTls(cfg.tlsListen, tls, splitHostPort(cfg.tlsListen).port);
      logger.info("mqtt listening", { tls_listen: `${splitHostPort(cfg.tlsListen).hostname}:${s.tlsListener.port}` });
    }
    if (cfg.wsListen) {
      s.ws = s.serveWs(cfg.wsListen, undefined, splitHostPort(cfg.wsListen).port);
      logger.info("mqtt listening", { ws_listen: `${splitHostPort(cfg.wsListen).hostname}:${s.ws.port}` });
    }
    if (cfg.wssListen && tls) {
      s.wss = s.serveWs(cfg.wssListen, tls, splitHostPort(cfg.wssListen).port);
      logger.info("mqtt listening", { wss_listen: `${splitHostPort(cfg.wssListen).hostname}:${s.wss.port}` });
    }
    if (cfg.socket) {
      await prepareSocketPath(cfg.socket);
      s.unix = Bun.listen<Conn>({ unix: cfg.socket, socket: handlers });
      logger.info("mqtt listening", { socket: cfg.socket });
    }
    return s;
  }

  /** The TCP port (tests listen on port 0). */
  get port(): number | undefined {
    return this.tcp?.port;
  }

  /** The ports of the TLS and WebSocket listeners (tests listen on port 0). */
  get ports(): { tls?: number; ws?: number; wss?: number } {
    return { tls: this.tlsListener?.port, ws: this.ws?.port, wss: this.wss?.port };
  }

  /** What `/v1/status` shows of the listener. */
  status(): Record<string, unknown> {
    const listeners: Record<string, string> = {};
    if (this.tcp && this.cfg.listen) listeners.tcp = `${splitHostPort(this.cfg.listen).hostname}:${this.tcp.port}`;
    if (this.unix && this.cfg.socket) listeners.socket = this.cfg.socket;
    if (this.tlsListener && this.cfg.tlsListen) listeners.tls = `${splitHostPort(this.cfg.tlsListen).hostname}:${this.tlsListener.port}`;
    if (this.ws && this.cfg.wsListen) listeners.ws = `${splitHostPort(this.cfg.wsListen).hostname}:${this.ws.port}`;
    if (this.wss && this.cfg.wssListen) listeners.wss = `${splitHostPort(this.cfg.wssListen).hostname}:${this.wss.port}`;
    const health = this.sessions.health();
    return {
      listeners,
      clients: this.clients.size,
      shared_groups: this.shared.count,
      delayed_wills: this.delayedWills.size,
      session_save_failures: health.failedSaves,
    };
  }

  /** New TLS material (SIGHUP): new connections use it, established ones stay up. */
  /**
   * New `mqtt.users` (a configuration reload). New logins use them; a
   * connected client whose user is gone, or whose password hash changed, is
   * disconnected (it logs in again, or is refused); one whose rules changed
   * keeps its session and gets the new rules from its next message on.
   * Returns how many clients were disconnected.
   */
  setUsers(users: MqttUser[]): number {
    this.cfg.users = users;
    let ended = 0;
    const sessions = [...this.sockets].map((s) => s.data.session).concat([...this.wsSockets].map((w) => w.data.session));
    for (const session of sessions) if (session && !session.reauthorize(users)) ended++;
    return ended;
  }

  reloadTls(tls: TlsMaterial): void {
    this.tls = tls;
    if (this.tlsListener && this.cfg.tlsListen) {
      const port = this.tlsListener.port;
      this.tlsListener.stop(false);
      this.tlsListener = this.listenTls(this.cfg.tlsListen, tls, port);
    }
    if (this.wss && this.cfg.wssListen) {
      const port = this.wss.port!;
      this.wss.stop(false);
      this.wss = this.serveWs(this.cfg.wssListen, tls, port);
    }
  }

  private listenTls(hostPort: string, tls: TlsMaterial, port: number): TCPSocketListener<Conn> {
    return Bun.listen<Conn>({ hostname: splitHostPort(hostPort).hostname, port, tls: bunOptionalClientCertOptions(tls), socket: this.handlers(true) });
  }

  private session(sock: Socket<Conn>, identity?: { certUser: string }): MqttSession {
    const out = sock.data.out;
    const wire = queueWire(out, () => {
      out.flushNow();
      out.close();
      sock.end();
    });
    return new MqttSession(this, wire, identity);
  }

  private handlers(tls: boolean) {
    const self = this;
    return {
      open(sock: Socket<Conn>) {
        // Packets of one turn (say, the PUBACKs of a group commit) go out in one write.
        const out = new OutQueue((b) => sock.write(b), CLIENT_HIGH_WATER_BYTES);
        // Writes are already joined per turn: Nagle would only hold acknowledgements back.
        if (sock.remoteAddress) sock.setNoDelay(true);
        sock.data = { out };
        self.sockets.add(sock);
        // Over TLS the session starts once the client's certificate (if any) is checked.
        if (tls) sock.data.early = [];
        else sock.data.session = self.session(sock);
      },
      handshake(sock: Socket<Conn>, ok: boolean, err: Error | null) {
        if (!tls) return;
        const start = (identity?: { certUser: string }) => {
          if (sock.data.session || !self.sockets.has(sock)) return;
          sock.data.session = self.session(sock, identity);
          const early = sock.data.early ?? [];
          sock.data.early = undefined;
          for (const chunk of early) sock.data.session.data(chunk);
        };
        let presented = false;
        try {
          presented = (sock.getPeerX509Certificate()?.raw?.length ?? 0) > 0;
        } catch {
          presented = false;
        }
        // No certificate: a password login (or none, without mqtt.users), as over TCP.
        if (!presented) return start();
        verifyPeer(sock as never, ok, err, self.tls!, "client", new Date(), "TLSv1.2").then(
          (peer) => start({ certUser: peer.name }),
          (e: unknown) => {
            // A certificate that fails is refused outright: a device with a wrong one must hear of it.
            self.logger.warn("mqtt client certificate refused", { remote: sock.remoteAddress, reason: e instanceof Error ? e.message : String(e) });
            sock.data.early = [];
            sock.end();
          },
        );
      },
      data(sock: Socket<Conn>, chunk: Uint8Array) {
        if (!sock.data.session) {
          // Before the certificate check: held (a copy: the buffer is reused), up to a limit.
          sock.data.earlyBytes = (sock.data.earlyBytes ?? 0) + chunk.length;
          if (sock.data.earlyBytes > MAX_EARLY_BYTES) return void sock.end();
          sock.data.early?.push(new Uint8Array(chunk));
          return;
        }
        try {
          sock.data.session.data(chunk);
        } catch (err) {
          // Whatever a client sends, the process goes on: that connection ends.
          sock.data.session?.fail(`internal error: ${String(err)}`);
        }
      },
      drain(sock: Socket<Conn>) {
        sock.data.out.drained();
      },
      close(sock: Socket<Conn>) {
        self.sockets.delete(sock);
        sock.data.out.close();
        sock.data.session?.socketClosed();
      },
      error(_sock: Socket<Conn>, err: Error) {
        self.logger.debug("mqtt socket error", { error: String(err) });
      },
    };
  }

  /** Wills waiting for their delay, by client id. */
  private readonly delayedWills = new Map<string, { timer: ReturnType<typeof setTimeout>; publish: () => void }>();

  delayWill(clientId: string, ms: number, publish: () => void): void {
    this.delayedWills.get(clientId)?.publish(); // an earlier one of the same id (a will each connection) goes now
    const timer = setTimeout(() => {
      this.delayedWills.delete(clientId);
      publish();
    }, ms);
    this.delayedWills.set(clientId, { timer, publish });
  }

  claim(clientId: string, s: MqttSession): void {
    // Back before its will's delay passed: the will is not published (MQTT 5, 3.1.2.11.2).
    const will = this.delayedWills.get(clientId);
    if (will) {
      clearTimeout(will.timer);
      this.delayedWills.delete(clientId);
    }
    const old = this.clients.get(clientId);
    this.clients.set(clientId, s);
    // MQTT: a second connection with the same client id takes the session over.
    if (old && old !== s) old.fail("taken over by a new connection of the same client id", 0x8e);
  }

  release(clientId: string, s: MqttSession): void {
    if (this.clients.get(clientId) === s) this.clients.delete(clientId);
  }

  count(): number {
    return this.clients.size;
  }

  /**
   * Ends the persistent sessions whose expiry has passed: their durable
   * subscribers go (releasing what they pinned in retention), and so does
   * what keyop kept about them.
   */
  async sweep(now = Date.now()): Promise<void> {
    for (const id of this.sessions.expired(now)) {
      if (this.clients.has(id)) continue;
      await this.endSession(id);
      this.logger.info("mqtt session expired", { client: id });
    }
  }

  async endSession(clientId: string): Promise<void> {
    this.shared.releaseAll(clientId);
    const name = sessionName(clientId);
    for (const sub of this.messenger.subscribers()) {
      if (sub.name !== name) continue;
      await this.messenger
        .deleteSubscriber(sub.pattern, name)
        .catch((err) => this.logger.warn("mqtt session's subscriber not deleted", { client: clientId, pattern: sub.pattern, error: String(err) }));
    }
    await this.sessions.drop(clientId).catch(() => undefined); // logged, counted and retried by the store
  }

  owner(clientId: string): MqttSession | undefined {
    return this.clients.get(clientId);
  }

  /**
   * MQTT over WebSocket (`tls`: over TLS): the `mqtt` subprotocol on any
   * path; each binary message carries stream bytes, as a TCP read would.
   */
  private serveWs(hostPort: string, tls: TlsMaterial | undefined, port: number): Server<WsConn> {
    const self = this;
    return Bun.serve<WsConn>({
      hostname: splitHostPort(hostPort).hostname,
      port,
      ...(tls ? { tls: { cert: tls.certPem, key: tls.keyPem } } : {}),
      fetch(req, server) {
        const asked = (req.headers.get("sec-websocket-protocol") ?? "").split(",").map((p) => p.trim());
        const headers: Record<string, string> = asked.includes("mqtt") ? { "Sec-WebSocket-Protocol": "mqtt" } : {};
        if (server.upgrade(req, { data: { waiters: [] }, headers })) return undefined;
        return new Response("MQTT over WebSocket: connect with a WebSocket client, subprotocol mqtt\n", { status: 426, headers: { Upgrade: "websocket" } });
      },
      websocket: {
        maxPayloadLength: self.cfg.maxPacketBytes + 16,
        open(ws) {
          self.wsSockets.add(ws);
          // Bun keeps what the socket did not take yet: all of it counts as written, and the
          // session waits (writable) while more than the high-water mark is buffered.
          const out = new OutQueue((b) => (ws.sendBinary(b) === 0 ? -1 : b.length), CLIENT_HIGH_WATER_BYTES);
          ws.data.out = out;
          ws.data.session = new MqttSession(self, {
            write: (bytes) => out.push(bytes),
            writeNow: (bytes) => out.pushNow(bytes),
            writeCopy: (bytes) => out.pushCopy(bytes),
            writable: () => (ws.getBufferedAmount() <= CLIENT_HIGH_WATER_BYTES ? out.writable() : new Promise<void>((r) => ws.data.waiters.push(r))),
            behind: () => ws.getBufferedAmount() > CLIENT_HIGH_WATER_BYTES || out.full,
            end() {
              out.flushNow();
              out.close();
              ws.close();
            },
          });
        },
        message(ws, msg) {
          const bytes = typeof msg === "string" ? new TextEncoder().encode(msg) : msg;
          try {
            ws.data.session?.data(bytes);
          } catch (err) {
            ws.data.session?.fail(`internal error: ${String(err)}`);
          }
        },
        drain(ws) {
          ws.data.out?.drained();
          for (const w of ws.data.waiters.splice(0)) w();
        },
        close(ws) {
          self.wsSockets.delete(ws);
          ws.data.out?.close();
          for (const w of ws.data.waiters.splice(0)) w();
          ws.data.session?.socketClosed();
        },
      },
    });
  }

  /** Stops listening, closes every client connection (their wills are published), saves the session state. */
  async stop(): Promise<void> {
    if (this.sweeper) clearInterval(this.sweeper);
    this.tcp?.stop(true);
    this.unix?.stop(true);
    this.tlsListener?.stop(true);
    this.ws?.stop(true);
    this.wss?.stop(true);
    for (const sock of this.sockets) sock.data.session?.socketClosed();
    for (const ws of this.wsSockets) ws.data.session?.socketClosed();
    // Wills still waiting for their delay go out now: their clients are gone with this process.
    for (const [id, w] of [...this.delayedWills]) {
      clearTimeout(w.timer);
      this.delayedWills.delete(id);
      w.publish();
    }
    this.shared.stop();
    await this.sessions.close().catch((err) => this.logger.error("mqtt session state not saved", { error: String(err) }));
  }
}
