/**
 * The MQTT listener: MQTT 3.1.1 and 5.0 on a TCP address and/or a Unix
 * socket, one MqttSession per connection. Packets are parsed and written
 * by mqtt-packet; the session rules are keyop's (src/mqtt/session.ts).
 */
import type { Socket, TCPSocketListener, UnixSocketListener } from "bun";
import type { MqttConfig } from "../config/schema.ts";
import type { Messenger } from "../messenger/messenger.ts";
import type { Logger } from "../observability/logger.ts";
import { prepareSocketPath } from "../net/socket-file.ts";
import { MqttSession, sessionName, sharedGroupName, type SessionHost } from "./session.ts";
import { SharedSubscriptions } from "./shared.ts";
import { RetainedStore } from "./retained.ts";
import { SessionStore } from "./session-store.ts";
import { join } from "node:path";
import { OutQueue } from "../net/out-queue.ts";

interface Conn {
  session?: MqttSession;
  out: OutQueue;
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
  private readonly clients = new Map<string, MqttSession>();
  private readonly sockets = new Set<Socket<Conn>>();
  readonly retained: RetainedStore;
  readonly sessions: SessionStore;
  readonly shared: SharedSubscriptions;
  private sweeper: ReturnType<typeof setInterval> | null = null;

  private constructor(messenger: Messenger, cfg: MqttConfig, logger: Logger, retained: RetainedStore, sessions: SessionStore) {
    this.messenger = messenger;
    this.cfg = cfg;
    this.logger = logger;
    this.retained = retained;
    this.sessions = sessions;
    this.shared = new SharedSubscriptions(
      (group, pattern) => messenger.openSubscriber(pattern, sharedGroupName(group), { from: "latest" }),
      (group, pattern) => messenger.deleteSubscriber(pattern, sharedGroupName(group)),
      (err) => logger.warn("mqtt shared subscription failed", { error: String(err) }),
    );
  }

  /** Starts listening on what `cfg` names; retained messages live under `dataDir`. */
  static async start(messenger: Messenger, cfg: MqttConfig, logger: Logger, dataDir: string): Promise<MqttServer> {
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
      const held = sessions.allRemembered().some(([, key]) => key.startsWith("$share/") && sharedGroupName(SharedSubscriptions.parts(key.slice("$share/".length))[0]) === sub.name && SharedSubscriptions.parts(key.slice("$share/".length))[1] === sub.pattern);
      if (!held) await messenger.deleteSubscriber(sub.pattern, sub.name).catch((err) => logger.warn("mqtt shared subscription's subscriber not deleted", { pattern: sub.pattern, error: String(err) }));
    }
    await s.sweep();
    s.sweeper = setInterval(() => void s.sweep(), SWEEP_EVERY_MS);
    s.sweeper.unref?.();
    const handlers = s.handlers();
    if (cfg.listen) {
      const i = cfg.listen.lastIndexOf(":");
      s.tcp = Bun.listen<Conn>({ hostname: cfg.listen.slice(0, i).replace(/^\[|\]$/g, ""), port: Number(cfg.listen.slice(i + 1)), socket: handlers });
      logger.info("mqtt listening", { listen: `${cfg.listen.slice(0, i)}:${s.tcp.port}` });
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

  private handlers() {
    const self = this;
    return {
      open(sock: Socket<Conn>) {
        // Packets of one turn (say, the PUBACKs of a group commit) go out in one write.
        const out = new OutQueue((b) => sock.write(b), CLIENT_HIGH_WATER_BYTES);
        // Writes are already joined per turn: Nagle would only hold acknowledgements back.
        if (sock.remoteAddress) sock.setNoDelay(true);
        sock.data = { out };
        self.sockets.add(sock);
        sock.data.session = new MqttSession(self, {
          write: (bytes) => out.push(bytes),
          writable: () => out.writable(),
          end() {
            out.flushNow();
            out.close();
            sock.end();
          },
        });
      },
      data(sock: Socket<Conn>, chunk: Uint8Array) {
        try {
          sock.data.session?.data(chunk);
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

  claim(clientId: string, s: MqttSession): void {
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

  /** Stops listening, closes every client connection (their wills are published), saves the session state. */
  async stop(): Promise<void> {
    if (this.sweeper) clearInterval(this.sweeper);
    this.tcp?.stop(true);
    this.unix?.stop(true);
    for (const sock of this.sockets) sock.data.session?.socketClosed();
    this.shared.stop();
    await this.sessions.close().catch((err) => this.logger.error("mqtt session state not saved", { error: String(err) }));
  }
}
