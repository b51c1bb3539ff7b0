/**
 * One MQTT client connection: the session rules on top of mqtt-packet's
 * parser and generator. Publishes go into the durable log (a QoS 1 PUBACK
 * only after the write is durable); subscriptions read the log through a
 * durable subscriber named `mqtt.<client id>` (persistent session) or a
 * volatile one (clean session), so a client that was away gets what it
 * missed, and unacknowledged QoS 1 messages come again.
 */
import mqtt from "mqtt-packet";
import type { IConnectPacket, ISubscribePacket, IUnsubscribePacket, Packet } from "mqtt-packet";
import { decodeEnvelope, type MessageMeta } from "../envelope/envelope.ts";
import { publisherIs, utf8Bytes } from "../envelope/scan.ts";
import type { Messenger, PublishOptions } from "../messenger/messenger.ts";
import type { StoredEnvelope } from "../messenger/durable-subscriber.ts";
import type { PublishWaiter } from "../messenger/queued-publish.ts";
import { Window } from "../messenger/window.ts";
import { payloadOf, pubackBytes, storedPayload } from "./payload.ts";
import { decodeFast, encodePublish, type Frame, frameBytes, LastTopic, MqttFramer, MqttFrameError, type Publish, publishSize } from "./codec.ts";
import { encodePublishProperties, fromPacketProperties, metaOfPublish, publishPropertiesOf, type PublishProperties } from "./properties.ts";
import { MqttSubscription, type SentFrom, type SubscriptionOptions } from "./subscription.ts";
import { type SharedMembership, SharedSubscriptions, type SharedMember } from "./shared.ts";
import { Outbound } from "./outbound.ts";
import type { Logger } from "../observability/logger.ts";
import type { MqttConfig, MqttUser } from "../config/schema.ts";
import { channelToTopic, filterToPatterns, hiddenFromWildcard, topicToChannel } from "./topics.ts";
import type { RetainedStore } from "./retained.ts";
import type { SessionStore } from "./session-store.ts";
import { compilePattern, compileRules } from "../envelope/names.ts";
import type { CopyBlocks } from "../bytes.ts";
import type { OutQueue } from "../net/out-queue.ts";

/** What a session needs from the server around it. */
export interface SessionHost {
  messenger: Messenger;
  cfg: MqttConfig;
  logger: Logger;
  /** Registers the client id; closes an older connection of the same client (takeover). */
  claim(clientId: string, s: MqttSession): void;
  release(clientId: string, s: MqttSession): void;
  /** Clients connected now. */
  count(): number;
  /** Sent marks (for DUP) and expiry of persistent sessions, kept across connections and restarts. */
  sessions: SessionStore;
  /** The session now holding a client id. */
  owner(clientId: string): MqttSession | undefined;
  /** Ends a persistent session: its durable subscribers and what is kept about it go. */
  endSession(clientId: string): Promise<void>;
  /** Ends the persistent sessions whose expiry has passed. */
  sweep(): Promise<void>;
  retained: RetainedStore;
  /** The listener's shared subscriptions ($share/<group>/<filter>). */
  shared: SharedSubscriptions;
  /** Runs `publish` (a will) after `ms`, unless `clientId` connects again before. */
  delayWill(clientId: string, ms: number, publish: () => void): void;
  /** Where the sessions copy what their sockets hand them. */
  inbound: CopyBlocks;
  /** The agent forwards over federation: a lone publish's PUBACK waits for the forward (see `publish`). */
  forwards: boolean;
}

/** The socket operations a session uses. */
export interface Wire {
  /** Queues bytes; false when the client is behind (more than the high-water mark queued). */
  write(bytes: Uint8Array): boolean;
  /** Writes bytes now, after anything queued, not at the end of this turn; returns as `write`. */
  writeNow(bytes: Uint8Array): boolean;
  /** `write` of a copy of a few bytes the caller reuses at once (a PUBACK); returns as `write`. */
  writeCopy(bytes: Uint8Array): boolean;
  /** Resolves once the client has caught up below the high-water mark. */
  writable(): Promise<void>;
  /** Whether `writable()` would wait now. */
  behind(): boolean;
  end(): void;
}

/** The wire of a socket whose outbound bytes go through `out`; `end` closes the socket. */
export function queueWire(out: OutQueue, end: () => void): Wire {
  return {
    write: (bytes) => out.push(bytes),
    writeNow: (bytes) => out.pushNow(bytes),
    writeCopy: (bytes) => out.pushCopy(bytes),
    writable: () => out.writable(),
    behind: () => out.full,
    end,
  };
}

/** Durable subscriber name of a persistent MQTT session. */
export function sessionName(clientId: string): string {
  return encodedName("mqtt", clientId);
}

/** Durable subscriber name of a shared subscription's group (one per group and pattern). */
export function sharedGroupName(group: string): string {
  return encodedName("mqtt-share", group);
}

/**
 * `<kind>.<id>` in three disjoint forms, so no two ids share a name:
 * readable for the ids that were always allowed (`<kind>.` + id), hex of
 * the UTF-8 for any other id short enough (`<kind>-x.`), and a SHA-256 for
 * a longer one (`<kind>-h.`: names are at most 128 bytes).
 */
function encodedName(kind: string, id: string): string {
  if (PLAIN_CLIENT_ID.test(id)) return `${kind}.${id}`;
  const bytes = new TextEncoder().encode(id);
  if (bytes.length <= 56) return `${kind}-x.${Buffer.from(bytes).toString("hex")}`;
  return `${kind}-h.${new Bun.CryptoHasher("sha256").update(bytes).digest("hex")}`;
}

/**
 * Packets handled per turn of the event loop: half a client's usual window
 * of QoS 1 publishes (64 by default in most clients). Such a window often
 * arrives in one read; its first half is stored in that turn with one write
 * and one fdatasync, and that half's PUBACKs go out in the next turn before
 * the second half is written (the log writes again only after a turn), so
 * the client sends its next publishes while keyop stores the rest. With a
 * whole window per commit the client and keyop took turns: the client
 * waited for the window's fdatasync, keyop for the client's next window.
 * Groups of 16 paid a commit per group for no more overlap
 * (docs/benchmarks.md has the figures). A larger window is still handled a
 * group per turn, so one client cannot hold the loop for its whole window.
 */
const PUMP_PACKETS = 32;
/** Parsed packets allowed to wait: past this a turn handles the excess too (a flooding client). */
const MAX_WAITING_PACKETS = 1024;

/** Client ids kept as they are in their session's name (what keyop accepted before any UTF-8 id). */
const PLAIN_CLIENT_ID = /^[A-Za-z0-9_.-]{1,100}$/;

/** Topics whose channels a session remembers, and channels whose topics; past this it starts over (a client that never repeats one). */
const CHANNELS_KEPT = 64;

/** A topic name as a PUBLISH to a subscriber carries it. */
interface TopicName {
  topic: string;
  /** Its UTF-8 (shared: read, never written into). */
  bytes: Uint8Array;
}

const topicEncoder = new TextEncoder();
const NO_BYTES = new Uint8Array(0);

/** Topic aliases a client may set (MQTT 5 CONNACK Topic Alias Maximum). */
const TOPIC_ALIAS_MAX = 64;

/** A publish waiting for its acknowledgement, in the order publishes came; the messenger tells it how its store came out. */
class PendingAck implements PublishWaiter {
  done = false;
  error: unknown = undefined;

  constructor(
    readonly id: number | undefined,
    readonly qos: number,
    private readonly settle: (ack: PendingAck, error: unknown) => void,
  ) {}

  publishSettled(error: unknown): void {
    this.settle(this, error);
  }
}

/** `$share/<group>/<filter>` split, or null for a filter that is not a shared subscription's; throws when malformed. */
export function sharedFilter(filter: string): { group: string; filter: string } | null {
  if (!filter.startsWith("$share/")) return null;
  const rest = filter.slice("$share/".length);
  const slash = rest.indexOf("/");
  const group = slash < 0 ? rest : rest.slice(0, slash);
  if (slash < 0 || group === "" || /[+#]/.test(group) || rest.length === slash + 1) throw new Error(`shared subscription ${JSON.stringify(filter)} is not $share/<group>/<filter>`);
  return { group, filter: rest.slice(slash + 1) };
}

/** An MQTT client connection and its session state. */
export class MqttSession implements SharedMember {
  readonly host: SessionHost;
  private readonly wire: Wire;
  private readonly parser: ReturnType<typeof mqtt.parser>;
  private readonly framer: MqttFramer;
  private readonly lastTopic = new LastTopic();
  private version: 3 | 4 | 5 = 4;
  private clientId = "";
  /** The client id's UTF-8, to tell its own publishes (no local). */
  private clientIdBytes: Uint8Array = new Uint8Array(0);
  /** Topic aliases the client set (MQTT 5), for this connection only. */
  private readonly aliases = new Map<number, string>();
  /** Topic aliases keyop set towards the client, and how many it takes (its CONNECT's Topic Alias Maximum). */
  private readonly outAliases = new Map<string, number>();
  private clientAliasMax = 0;
  /**
   * How long the session outlives this connection, ms: 0 for a clean 3.1.1
   * session or an MQTT 5 session expiry of 0; never more than
   * mqtt.session_expiry (MQTT 5's "never", 0xFFFFFFFF, included).
   */
  private expiryMs = 0;
  /** The session keeps state past this connection (durable subscribers, sent marks). */
  private get persistent(): boolean {
    return this.expiryMs > 0;
  }
  private connected = false;
  private closed = false;
  private will: IConnectPacket["will"] | undefined;
  private keepalive = 0;
  private lastPacket = Date.now();
  private timer: ReturnType<typeof setInterval> | null = null;
  private readonly subscriptions = new Map<string, MqttSubscription>();
  /** Shared subscriptions this session is a member of, by SharedSubscriptions.key. */
  private readonly shared = new Map<string, SharedMembership>();
  /** QoS 1 and 2 messages sent and not completed. */
  private readonly outbound: Outbound;
  /** QoS 1 messages in flight to the client, over every subscription and retained messages. */
  readonly window: Window;
  /** QoS 2 publishes stored and not yet released, by packet id. */
  private readonly qos2 = new Map<number, Promise<unknown>>();
  /** The logged-in user's rules (null: no users configured, everything allowed). */
  private mayPublish: ((channel: string) => boolean) | null = null;
  private maySubscribe: ((channel: string) => boolean) | null = null;
  /** Who logged in, and how (null: no users were configured then). */
  private login: { user: MqttUser; byCertificate: boolean } | null = null;

  /** Who the transport proved the client to be (a verified client certificate's CN). */
  private readonly identity: { certUser: string } | undefined;

  constructor(host: SessionHost, wire: Wire, identity?: { certUser: string }) {
    this.host = host;
    this.wire = wire;
    this.identity = identity;
    this.window = new Window(Math.min(host.cfg.maxInflight, this.clientReceiveMax));
    this.outbound = new Outbound(this.window);
    this.parser = mqtt.parser({ protocolVersion: 5 });
    this.framer = new MqttFramer(host.cfg.maxPacketBytes);
    this.parser.on("packet", (p: Packet) => this.queue(p));
    this.parser.on("error", (err: Error) => this.fail(`malformed packet: ${err.message}`));
  }

  /** Bytes from the client. */
  data(chunk: Uint8Array): void {
    if (this.closed) return;
    this.lastPacket = Date.now();
    let frames: Frame[];
    try {
      // A copy: the socket's buffer is reused after this callback, and packets may wait a turn.
      frames = this.framer.feed(this.host.inbound.copy(chunk));
    } catch (err) {
      return this.fail((err as Error).message, err instanceof MqttFrameError ? err.reason : 0x81);
    }
    for (const f of frames) {
      // The message path's packets by hand once connected; the rest (and a CONNECT's version) by mqtt-packet.
      let p: Packet | null;
      try {
        p = this.connected ? decodeFast(f, this.version, this.lastTopic) : null;
      } catch (err) {
        return this.fail((err as Error).message, err instanceof MqttFrameError ? err.reason : 0x81);
      }
      if (p) this.incoming.push(p);
      else this.parser.parse(frameBytes(f));
      if (this.closed) return;
    }
    // The first group is handled in this turn; only what is left waits for the next.
    if (!this.pumping && this.incoming.length > 0) {
      this.pumping = true;
      this.pump();
    }
  }

  /** Packets parsed and not yet handled, in order (see PUMP_PACKETS). */
  private readonly incoming: Packet[] = [];
  private pumping = false;

  private queue(p: Packet): void {
    this.incoming.push(p);
  }

  private readonly pump = (): void => {
    this.handle(Math.max(Math.min(this.incoming.length, PUMP_PACKETS), this.incoming.length - MAX_WAITING_PACKETS));
    if (this.incoming.length > 0 && !this.closed) setImmediate(this.pump);
    else this.pumping = false;
  };

  /** Handles the first `n` waiting packets. */
  private handle(n: number): void {
    this.alone = n === 1 && this.incoming.length === 1;
    try {
      for (let i = 0; i < n && !this.closed; i++) this.packet(this.incoming[i]!);
    } catch (err) {
      // Whatever a client sends, the process goes on: that connection ends.
      this.fail(`internal error: ${String(err)}`);
    } finally {
      this.alone = false;
      this.incoming.splice(0, n);
    }
  }

  /**
   * The packet being handled is the only one of its read, with none waiting
   * behind it: a publish may then be written at once. Publishes that come
   * together are left to share one write.
   */
  private alone = false;

  private send(p: Packet): void {
    if (this.closed) return;
    this.wire.write(mqtt.generate(p, { protocolVersion: this.version }));
  }

  /** Ends the connection with a reason (v5 DISCONNECT code when known); the will is published. */
  fail(reason: string, code = 0x81): void {
    if (this.closed) return;
    this.host.logger.warn("mqtt client dropped", { client: this.clientId || undefined, reason });
    // MQTT 5 says why, in words too (unless the client asked for no problem information).
    if (this.connected && this.version === 5) this.send({ cmd: "disconnect", reasonCode: code, ...this.reasonString(reason) } as Packet);
    this.shutdown(true);
  }

  /** The socket closed (from either side). */
  socketClosed(): void {
    // What arrived before the close counts: publishes are stored, a DISCONNECT drops the will.
    this.handle(this.incoming.length);
    this.shutdown(true);
  }

  private shutdown(publishWill: boolean): void {
    if (this.closed) return;
    this.closed = true;
    // Unless a newer connection of the same client id took the session over.
    const mine = this.connected && this.host.owner(this.clientId) === this;
    if (this.timer) clearInterval(this.timer);
    let durable = false;
    for (const d of this.subscriptions.values()) {
      d.stop();
      if (!d.durable) this.host.messenger.dropVolatileSubscriber(d.subscriber);
      durable ||= d.durable;
    }
    this.subscriptions.clear();
    // Out of its groups first, so that what a group gave this member and it did not acknowledge
    // goes to another member, not back to this one.
    for (const m of this.shared.values()) {
      this.host.shared.leave(m);
      this.outbound.returnTo(m, () => {});
    }
    // A persistent session still holds its shared subscriptions while it is away; a clean one's end.
    if (!this.persistent && mine) for (const key of this.shared.keys()) this.host.shared.release(this.clientId, key);
    this.shared.clear();
    this.outbound.clear();
    this.retainedOut = [];
    if (this.connected) {
      // The session's life after this connection starts now: kept for expiryMs, or ended at once.
      this.host.release(this.clientId, this);
      // The session store logs, counts and retries a failed save itself.
      if (mine && this.persistent) void this.host.sessions.disconnected(this.clientId, this.expiryMs).catch(() => undefined);
      else if (mine && (durable || this.host.sessions.knows(this.clientId))) void this.host.endSession(this.clientId);
      // A short expiry is swept on time, not at the next minute's sweep.
      if (mine && this.persistent && this.expiryMs < 86_400_000) setTimeout(() => void this.host.sweep(), this.expiryMs + 100).unref?.();
    }
    if (publishWill && this.will) {
      const w = this.will;
      this.will = undefined;
      const publish = () =>
        void this.store(w.topic, Buffer.from(w.payload), w.qos ?? 0, w.retain === true, fromPacketProperties(w.properties as Record<string, unknown> | undefined)).catch((err) =>
          this.host.logger.warn("mqtt will not published", { client: this.clientId, error: String(err) }),
        );
      // MQTT 5 Will Delay Interval: published when it has passed or the session ends, whichever is
      // first, unless the client connects again before (a reconnect after a short outage).
      const delaySeconds = this.version === 5 ? Number((w.properties as { willDelayInterval?: number } | undefined)?.willDelayInterval ?? 0) : 0;
      const delayMs = Math.min(delaySeconds * 1000, this.expiryMs);
      if (delayMs > 0 && mine) this.host.delayWill(this.clientId, delayMs, publish);
      else publish();
    }
    this.wire.end();
  }

  /**
   * `users` replace the configured users: false when this client must go
   * (disconnected now: its user is gone, its password changed, or users
   * were configured where there were none), otherwise its rules are the
   * new ones from the next message on.
   */
  reauthorize(users: MqttUser[]): boolean {
    if (this.closed || (!this.connected && !this.connecting)) return true;
    if (users.length === 0) {
      this.mayPublish = null;
      this.maySubscribe = null;
      this.login = null;
      return true;
    }
    const now = this.login ? users.find((u) => u.name === this.login!.user.name) : undefined;
    if (!now || (!this.login!.byCertificate && now.passwordHash !== this.login!.user.passwordHash)) {
      this.fail(!this.login ? "mqtt.users now asks for a login" : now ? "the user's password changed" : "the user is no longer in mqtt.users", 0x87);
      return false;
    }
    this.login = { user: now, byCertificate: this.login!.byCertificate };
    this.mayPublish = compileRules(now.publish);
    this.maySubscribe = compileRules(now.subscribe);
    return true;
  }

  /** Whether the logged-in user may receive messages of `channel`. */
  mayReceive(channel: string): boolean {
    return !this.maySubscribe || this.maySubscribe(channel);
  }

  /** Resolves when the client's socket has room again. */
  writable(): Promise<void> {
    return this.wire.writable();
  }

  /** More than the high-water mark waits to go to the client. */
  behind(): boolean {
    return this.wire.behind();
  }

  /** Room for more QoS 1 messages in flight to this client. */
  room(): number {
    return this.window.room();
  }

  /** MQTT 5 CONNECT: QoS 1 messages the client takes unacknowledged, and its largest packet. */
  private clientReceiveMax = 65_535;
  private clientMaxPacket = Number.POSITIVE_INFINITY;

  private packet(p: Packet): void {
    if (this.closed) return;
    if (this.connecting) return void this.waiting.push(p);
    if (!this.connected && p.cmd !== "connect") return this.fail(`${p.cmd} before CONNECT`);
    switch (p.cmd) {
      case "connect":
        return this.connect(p);
      case "publish":
        return this.publish(p);
      case "puback":
        return this.puback(p.messageId!);
      case "pubrec":
        return this.pubrec(p.messageId!, (p as { reasonCode?: number }).reasonCode ?? 0);
      case "pubcomp":
        return this.pubcomp(p.messageId!);
      case "pubrel":
        this.qos2.delete(p.messageId!);
        return this.send({ cmd: "pubcomp", messageId: p.messageId } as Packet);
      case "subscribe":
        return this.subscribe(p);
      case "unsubscribe":
        return this.unsubscribe(p);
      case "pingreq":
        return this.send({ cmd: "pingresp" });
      case "disconnect": {
        // MQTT 5: DISCONNECT may change the session expiry, but not from 0 to more.
        const asked = (p as { properties?: { sessionExpiryInterval?: number } }).properties?.sessionExpiryInterval;
        if (asked !== undefined && (this.expiryMs > 0 || asked === 0)) this.expiryMs = this.expiryFor(asked);
        // A clean disconnect drops the will (v5: unless the reason asks for it).
        return this.shutdown((p as { reasonCode?: number }).reasonCode === 0x04);
      }
      default:
        return this.fail(`unexpected ${p.cmd}`);
    }
  }

  /** MQTT 5: the client did not ask to be spared reason strings. */
  private problemInfo = true;

  /** A Reason String property for a refusal (MQTT 5 allows up to 65,535 bytes; keyop's are short). */
  private reasonString(why: string): { properties?: { reasonString: string } } {
    return this.problemInfo ? { properties: { reasonString: why.slice(0, 500) } } : {};
  }

  private connect(p: IConnectPacket): void {
    if (this.connected || this.connecting) return this.fail("second CONNECT");
    const users = this.host.cfg.users;
    if (users.length === 0) return this.accept(p);
    // A client certificate (MQTT over TLS) names the user by its CN: no password then.
    const certUser = this.identity?.certUser;
    const user = users.find((u) => u.name === (certUser ?? p.username));
    if (certUser !== undefined) {
      this.version = p.protocolVersion === 5 ? 5 : p.protocolVersion === 3 ? 3 : 4;
      if (!user) {
        this.host.logger.warn("mqtt login refused: certificate CN is not in mqtt.users", { user: certUser, client: p.clientId });
        this.send(this.version === 5 ? ({ cmd: "connack", reasonCode: 0x87, sessionPresent: false } as Packet) : ({ cmd: "connack", returnCode: 5, sessionPresent: false } as Packet));
        return this.shutdown(false);
      }
      this.mayPublish = compileRules(user.publish);
      this.maySubscribe = compileRules(user.subscribe);
      this.login = { user, byCertificate: true };
      return this.accept(p);
    }
    // Logins are checked off the packet path (password hashes are slow on purpose); what the
    // client sends meanwhile waits.
    this.connecting = true;
    const password = p.password ? Buffer.from(p.password).toString("utf8") : "";
    // A user without a password hash logs in with a certificate only.
    void (user?.passwordHash ? Bun.password.verify(password, user.passwordHash).catch(() => false) : Promise.resolve(false)).then((ok) => {
      this.connecting = false;
      if (this.closed) return;
      this.version = p.protocolVersion === 5 ? 5 : p.protocolVersion === 3 ? 3 : 4;
      if (!ok || !user) {
        this.host.logger.warn("mqtt login refused", { user: p.username, client: p.clientId });
        this.send(this.version === 5 ? ({ cmd: "connack", reasonCode: 0x86, sessionPresent: false } as Packet) : ({ cmd: "connack", returnCode: 4, sessionPresent: false } as Packet));
        return this.shutdown(false);
      }
      this.mayPublish = compileRules(user.publish);
      this.maySubscribe = compileRules(user.subscribe);
      this.login = { user, byCertificate: false };
      this.accept(p);
      for (const q of this.waiting.splice(0)) this.packet(q);
    });
  }

  private connecting = false;
  /** The keep-alive keyop set in place of the client's (CONNACK Server Keep Alive). */
  private serverKeepalive: number | undefined;
  /** The client sent an empty client id and keyop made one up. */
  private assignedId = false;
  private readonly waiting: Packet[] = [];

  private accept(p: IConnectPacket): void {
    this.version = p.protocolVersion === 5 ? 5 : p.protocolVersion === 3 ? 3 : 4;
    this.problemInfo = (p.properties as { requestProblemInformation?: boolean } | undefined)?.requestProblemInformation !== false;
    const refuse = (v5: number, v4: number, why: string) => {
      this.host.logger.warn("mqtt connect refused", { client: p.clientId, reason: why });
      this.send(
        this.version === 5 ? ({ cmd: "connack", reasonCode: v5, sessionPresent: false, ...this.reasonString(why) } as Packet) : ({ cmd: "connack", returnCode: v4, sessionPresent: false } as Packet),
      );
      this.shutdown(false);
    };
    if (this.host.count() >= this.host.cfg.maxClients) return refuse(0x97, 3, "mqtt.max_clients reached");
    let id = p.clientId ?? "";
    if (id === "") {
      if (!p.clean) return refuse(0x85, 2, "an empty client id needs a clean session");
      id = `anon-${Bun.randomUUIDv7()}`;
      this.assignedId = true;
    }
    // Any UTF-8 string MQTT allows (MAC addresses, "device/42", spaces, non-ASCII); U+0000 it does not.
    if (id.includes("\u0000")) return refuse(0x85, 2, "a client id must not hold U+0000");
    this.clientId = id;
    this.clientIdBytes = utf8Bytes(id);
    const cleanStart = p.clean !== false;
    // 3.1.1: clean session 0 keeps the session for mqtt.session_expiry. MQTT 5: clean start and
    // session expiry are apart; the client asks for an expiry (none: 0), capped by the config.
    const asked = (p.properties as { sessionExpiryInterval?: number } | undefined)?.sessionExpiryInterval;
    this.expiryMs = this.version === 5 ? this.expiryFor(asked ?? 0) : cleanStart ? 0 : this.host.cfg.sessionExpiryMs;
    // A copy of its own: the packet's bytes share a block with other packets, which the will would keep.
    this.will = p.will ? { ...p.will, payload: Buffer.from(p.will.payload) } : undefined;
    if (this.will) {
      try {
        topicToChannel(this.will.topic);
        metaOfPublish(fromPacketProperties(this.will.properties as Record<string, unknown> | undefined), 0); // its response topic
      } catch (err) {
        // MQTT 5 says why (topic name invalid); 3.1.1 has no code for it (2 would blame the client
        // id), so the connection closes, as for a publish to a bad topic.
        if (this.version === 5) return refuse(0x90, 2, `will topic: ${String(err)}`);
        this.host.logger.warn("mqtt connect refused", { client: p.clientId, reason: `will topic: ${String(err)}` });
        return this.shutdown(false);
      }
    }
    // MQTT 5 Server Keep Alive: a client asking for none or more than mqtt.max_keepalive gets the cap.
    this.keepalive = p.keepalive ?? 0;
    const cap = this.host.cfg.maxKeepaliveS;
    if (this.version === 5 && cap > 0 && (this.keepalive === 0 || this.keepalive > cap)) {
      this.keepalive = cap;
      this.serverKeepalive = cap;
    }
    const props = p.properties as { receiveMaximum?: number; maximumPacketSize?: number; topicAliasMaximum?: number } | undefined;
    if (this.version === 5 && props?.topicAliasMaximum) this.clientAliasMax = props.topicAliasMaximum;
    if (this.version === 5 && props?.receiveMaximum) {
      this.clientReceiveMax = props.receiveMaximum;
      this.window.resize(Math.min(this.host.cfg.maxInflight, this.clientReceiveMax));
    }
    if (this.version === 5 && props?.maximumPacketSize) this.clientMaxPacket = props.maximumPacketSize;
    this.connected = true;
    this.host.claim(id, this);
    const name = sessionName(id);
    const kept = this.host.messenger.subscribers().filter((s) => s.name === name);
    if (cleanStart && kept.length > 0) {
      // Starting over: what a persistent session of this id kept goes first (what the client
      // sends meanwhile waits).
      this.connecting = true;
      void this.host.endSession(id).then(() => {
        this.connecting = false;
        if (this.closed) return;
        this.welcome(false, asked);
        for (const q of this.waiting.splice(0)) this.packet(q);
      });
      return;
    }
    if (cleanStart) void this.host.sessions.drop(id).catch(() => undefined); // logged, counted and retried by the store
    this.welcome(kept.length > 0, asked);
  }

  /** The session expiry for an MQTT 5 Session Expiry Interval (seconds), capped by mqtt.session_expiry. */
  private expiryFor(seconds: number): number {
    return Math.min(seconds * 1000, this.host.cfg.sessionExpiryMs);
  }

  /** CONNACK, keep-alive, and the kept subscriptions resumed. */
  private welcome(present: boolean, askedExpiry: number | undefined): void {
    const id = this.clientId;
    if (this.persistent) void this.host.sessions.connected(id, this.expiryMs).catch(() => undefined); // logged, counted and retried by the store
    const props: Record<string, number | string | boolean> = {
      maximumPacketSize: this.host.cfg.maxPacketBytes,
      receiveMaximum: this.host.cfg.receiveMaximum,
      topicAliasMaximum: TOPIC_ALIAS_MAX,
      retainAvailable: true,
      wildcardSubscriptionAvailable: true,
      subscriptionIdentifiersAvailable: true,
      sharedSubscriptionAvailable: true,
    };
    if (this.serverKeepalive !== undefined) props.serverKeepAlive = this.serverKeepalive;
    // MQTT 5: a client that sent no id is told the one it got.
    if (this.assignedId) props.assignedClientIdentifier = id;
    // The client asked for more than the config allows: CONNACK says what it got.
    if (askedExpiry !== undefined && askedExpiry * 1000 > this.expiryMs) props.sessionExpiryInterval = Math.floor(this.expiryMs / 1000);
    this.send(this.version === 5 ? ({ cmd: "connack", reasonCode: 0, sessionPresent: present, properties: props } as Packet) : ({ cmd: "connack", returnCode: 0, sessionPresent: present } as Packet));
    if (this.keepalive > 0) {
      this.timer = setInterval(
        () => {
          if (Date.now() - this.lastPacket > this.keepalive * 1500) this.fail(`no packet for 1.5 x keepalive (${this.keepalive} s)`, 0x8d);
        },
        Math.max(250, (this.keepalive * 1000) / 2),
      );
      this.timer.unref?.();
    }
    // A kept session resumes its subscriptions, resending what was not acknowledged (also when
    // this connection will not keep it: MQTT 5 with clean start 0 and expiry 0 gets what was kept).
    if (present) {
      for (const [key, kept] of this.host.sessions.rememberedAll(id)) {
        if (!key.startsWith("$share/")) continue;
        const [group, pattern] = SharedSubscriptions.parts(key.slice("$share/".length));
        this.shared.set(key.slice("$share/".length), this.host.shared.join(id, this, group, pattern, kept.options));
      }
      // First the PUBRELs of QoS 2 messages the client had received and not completed.
      for (const pid of this.host.sessions.pendingReleases(id)) {
        this.outbound.owe(pid);
        this.send({ cmd: "pubrel", messageId: pid } as Packet);
      }
      const name = sessionName(id);
      for (const s of this.host.messenger.subscribers()) {
        if (s.name !== name) continue;
        // As subscribed (3.1.1 and sessions saved before options were kept: QoS 1, no options).
        const kept = this.host.sessions.remembered(id, s.pattern);
        this.startSubscription(s.pattern, kept?.filter ?? channelToTopic(s.pattern), kept?.options ?? { qos: 1, noLocal: false, retainAsPublished: false, id: 0 }, "durable");
      }
    }
  }

  /** Publishes a will at `qos` with its properties; `retain`: it also becomes the channel's retained message. */
  private async store(topic: string, payload: Buffer, qos: number, retain: boolean, props: PublishProperties | undefined): Promise<void> {
    const channel = topicToChannel(topic);
    const now = Date.now();
    await this.host.messenger.publish(channel, this.host.cfg.payloadType, payloadOf(payload), { meta: this.storedMeta(props, qos, retain, now) });
    if (retain) await this.host.retained.set(channel, payload, qos, metaOfPublish(props, now));
  }

  /** What is stored with a publish of this client: its properties, QoS, retain flag, and who sent it. */
  private storedMeta(props: PublishProperties | undefined, qos: number, retain: boolean, now: number): MessageMeta {
    const meta = metaOfPublish(props, now);
    meta.publisher = this.clientId;
    meta.qos = qos === 2 ? 2 : qos === 1 ? 1 : 0;
    if (retain) meta.retain = true;
    return meta;
  }

  /**
   * The options a publish of this client is stored with. A publish with no
   * properties and no retain flag (nearly all of them) has the same
   * metadata as the last of its QoS: one object per QoS, made once and
   * shared, never changed by anyone (the messenger copies before it adds).
   */
  private optionsOf(props: PublishProperties | undefined, qos: number, retain: boolean): PublishOptions {
    if (props === undefined && !retain) {
      let o = this.plainOptions[qos];
      if (o === undefined) {
        o = { meta: this.storedMeta(undefined, qos, false, 0) };
        this.plainOptions[qos] = o;
      }
      return o;
    }
    return { meta: this.storedMeta(props, qos, retain, Date.now()) };
  }

  /** `optionsOf` a publish with no properties, by QoS. */
  private readonly plainOptions: (PublishOptions | undefined)[] = [undefined, undefined, undefined];

  private publish(p: Publish): void {
    const qos = p.qos ?? 0;
    const id = p.messageId;
    const props = p.props;
    let topic = p.topic;
    if (this.version === 5 && props?.topicAlias !== undefined) {
      // A topic alias: set with a topic, used with an empty one (this connection only).
      const alias = props.topicAlias;
      if (alias === 0 || alias > TOPIC_ALIAS_MAX) return this.fail(`topic alias ${alias} is outside 1..${TOPIC_ALIAS_MAX}`, 0x94);
      if (topic === "") {
        const known = this.aliases.get(alias);
        if (known === undefined) return this.fail(`topic alias ${alias} was never set`, 0x82);
        topic = known;
      } else this.aliases.set(alias, topic);
    }
    let channel: string;
    let opts: PublishOptions;
    try {
      channel = this.channelOf(topic);
      opts = this.optionsOf(props, qos, p.retain === true);
    } catch (err) {
      // v5 can say why in the ack; 3.1.1 has no way but to close.
      if (this.version === 5 && qos > 0) return this.send({ cmd: qos === 1 ? "puback" : "pubrec", messageId: id, reasonCode: 0x90 } as Packet);
      return this.fail(`bad topic: ${String(err)}`, 0x90);
    }
    if (this.mayPublish && !this.mayPublish(channel)) {
      this.host.logger.warn("mqtt publish outside the user's rules", { client: this.clientId, channel });
      if (this.version === 5 && qos > 0) return this.send({ cmd: qos === 1 ? "puback" : "pubrec", messageId: id, reasonCode: 0x87 } as Packet);
      return this.fail(`not authorized to publish on ${channel}`, 0x87);
    }
    const max = this.host.cfg.receiveMaximum;
    if (qos > 0 && this.version === 5 && this.acks.length + this.qos2.size >= max && this.inboundInFlight() >= max) {
      return this.fail(`more than ${max} QoS 1 and 2 publishes unacknowledged (the Receive Maximum keyop gave)`, 0x93);
    }
    const earlier = qos === 2 && id !== undefined ? this.qos2.get(id) : undefined;
    if (earlier) {
      // The same QoS 2 publish again before PUBREL: not stored twice; PUBREC once the first is durable.
      const again = new PendingAck(id, qos, this.settleAck);
      this.acks.push(again);
      this.settleWhen(again, earlier);
      return;
    }
    const payload = payloadOf(p.payload as Buffer);
    // Stored at once, so that publishes in flight together share one group commit (the log keeps
    // their order); the acknowledgements go out in the order the publishes came, each once its
    // own write (and, for a retained one, the retained copy) is durable.
    let stored: Promise<unknown> | undefined;
    if (this.alone && qos < 2 && !p.retain && this.acks.length === 0) {
      // Alone in its read with nothing before it unacknowledged: written now, and acknowledged at
      // once when the write is done (a board's publish, one a wake-up).
      try {
        const r = this.host.messenger.publishNow(channel, this.host.cfg.payloadType, payload, opts);
        if (!(r instanceof Promise)) {
          // Nothing else of this read is coming to join it: the end of the turn would only cost a
          // callback. On an agent with links, written after this turn's microtasks, in which a
          // link's reader forwards the message: the PUBACK wakes the client, which could take the
          // core before the forward.
          if (qos === 1) {
            if (this.host.forwards) this.pubackSoon(id!);
            else this.wire.writeNow(pubackBytes(id!));
          }
          return;
        }
        stored = r;
      } catch (err) {
        stored = Promise.reject(err);
      }
    }
    const ack = new PendingAck(id, qos, this.settleAck);
    this.acks.push(ack);
    if (stored === undefined && qos < 2 && !p.retain) {
      // One of a window: queued for the next group commit, its ack told by a call, no promise.
      this.host.messenger.publishTo(channel, this.host.cfg.payloadType, payload, opts, ack);
      return;
    }
    stored ??= this.host.messenger.publish(channel, this.host.cfg.payloadType, payload, opts);
    if (p.retain) stored = this.retainAfter(stored, channel, p.payload as Buffer, qos, props);
    // A QoS 2 packet id is taken from now until PUBREL (or until its write fails).
    if (qos === 2 && id !== undefined) this.qos2.set(id, stored);
    this.settleWhen(ack, stored);
  }

  // The callbacks of `publish` live in functions of their own: a function that makes a closure
  // anywhere in it allocates its scope on every call until the JIT has optimized it.

  /** How an acknowledgement's store came out. The messenger calls this, maybe inside a commit of the log: it must not throw. */
  private readonly settleAck = (ack: PendingAck, error: unknown): void => {
    try {
      this.settle(ack, error);
    } catch (err) {
      // Whatever goes wrong with one client's acknowledgements, the log's commit goes on: that connection ends.
      try {
        this.fail(`internal error: ${String(err)}`);
      } catch {
        this.shutdown(true);
      }
    }
  };

  /** Packet ids of lone publishes whose PUBACK goes after this turn's microtasks. */
  private readonly soon: number[] = [];

  private pubackSoon(id: number): void {
    if (this.soon.push(id) === 1) queueMicrotask(this.writeSoon);
  }

  private readonly writeSoon = (): void => {
    const ids = this.soon;
    for (let i = 0; i < ids.length && !this.closed; i++) this.wire.writeNow(pubackBytes(ids[i]!));
    ids.length = 0;
  };

  /** Settles `ack` once `stored` has, either way. */
  private settleWhen(ack: PendingAck, stored: Promise<unknown>): void {
    stored.then(
      () => this.settle(ack, undefined),
      (err: unknown) => this.settle(ack, err),
    );
  }

  /** `stored`, then the channel's retained message set to this publish. */
  private retainAfter(stored: Promise<unknown>, channel: string, payload: Buffer, qos: number, props: PublishProperties | undefined): Promise<unknown> {
    return stored.then(() => this.host.retained.set(channel, payload, qos, metaOfPublish(props, Date.now())));
  }

  /** Channels of the topics this client published to lately (a client publishes to a few, again and again). */
  private readonly channels = new Map<string, string>();

  /** `topicToChannel`, remembered for up to CHANNELS_KEPT topics (a topic that has none is not kept). */
  private channelOf(topic: string): string {
    let c = this.channels.get(topic);
    if (c === undefined) {
      c = topicToChannel(topic);
      if (this.channels.size >= CHANNELS_KEPT) this.channels.clear();
      this.channels.set(topic, c);
    }
    return c;
  }

  /** Topic names of the channels delivered to this client lately, with their bytes (a few channels, again and again). */
  private readonly topicNames = new Map<string, TopicName>();

  /** `channelToTopic` and the topic's UTF-8, remembered for up to CHANNELS_KEPT channels. */
  private topicOf(channel: string): TopicName {
    let t = this.topicNames.get(channel);
    if (t === undefined) {
      const topic = channelToTopic(channel);
      t = { topic, bytes: topicEncoder.encode(topic) };
      if (this.topicNames.size >= CHANNELS_KEPT) this.topicNames.clear();
      this.topicNames.set(channel, t);
    }
    return t;
  }

  /** QoS 1 publishes not yet acknowledged and QoS 2 ones not yet released. */
  private inboundInFlight(): number {
    let n = this.qos2.size;
    for (const a of this.acks) if (a.qos === 1) n++;
    return n;
  }

  /** Pending acknowledgements, in the order their publishes came. */
  private readonly acks: PendingAck[] = [];

  /** A PUBACK with success for `id`, in bytes reused by the next call (see `Wire.writeCopy`). */
  private pubackOf(id: number): Uint8Array {
    const b = this.pubackScratch;
    b[2] = (id >> 8) & 0xff;
    b[3] = id & 0xff;
    return b;
  }

  private readonly pubackScratch = pubackBytes(0);

  private settle(ack: PendingAck, error: unknown): void {
    ack.done = true;
    ack.error = error;
    while (this.acks.length > 0 && this.acks[0]!.done && !this.closed) {
      const a = this.acks.shift()!;
      if (a.error !== undefined) {
        const code = (a.error as { code?: string }).code;
        // Not stored: the client may send it again under the same id.
        if (a.qos === 2 && a.id !== undefined) this.qos2.delete(a.id);
        if (this.version === 5 && a.qos > 0) {
          this.send({ cmd: a.qos === 1 ? "puback" : "pubrec", messageId: a.id, reasonCode: code === "disk_full" || code === "buffer_full" ? 0x97 : 0x80 } as Packet);
          continue;
        }
        return this.fail(`publish failed: ${String(a.error)}`);
      }
      // Only now, with the message durable, the acknowledgement.
      if (a.qos === 1) this.wire.writeCopy(this.pubackOf(a.id!));
      else if (a.qos === 2 && a.id !== undefined) {
        this.send({ cmd: "pubrec", messageId: a.id } as Packet);
      }
    }
  }

  private subscribe(p: ISubscribePacket): void {
    const granted: number[] = [];
    const retained: [string, SubscriptionOptions][] = [];
    // MQTT 5: one Subscription Identifier for every filter of the packet (0: none).
    const subId = this.version === 5 ? Number((p.properties as { subscriptionIdentifier?: number } | undefined)?.subscriptionIdentifier ?? 0) : 0;
    for (const s of p.subscriptions) {
      let patterns: string[];
      let share: { group: string; filter: string } | null;
      try {
        share = sharedFilter(s.topic);
        patterns = filterToPatterns(share?.filter ?? s.topic);
      } catch (err) {
        this.host.logger.warn("mqtt subscription refused", { client: this.clientId, filter: s.topic, error: String(err) });
        granted.push(this.version === 5 ? 0x8f : 0x80);
        continue;
      }
      const v5 = this.version === 5 ? (s as { nl?: boolean; rap?: boolean; rh?: number }) : {};
      const options: SubscriptionOptions = { qos: (s.qos >= 2 ? 2 : s.qos >= 1 ? 1 : 0) as 0 | 1 | 2, noLocal: v5.nl === true, retainAsPublished: v5.rap === true, id: subId };
      granted.push(options.qos);
      if (share) {
        // No retained messages for a shared subscription (MQTT 4.8.2), and no "no local".
        options.noLocal = false;
        for (const pattern of patterns) this.joinShared(share.group, pattern, s.topic, options);
        continue;
      }
      // MQTT 5 retain handling: 0 sends the retained messages, 1 only for a subscription that is
      // new, 2 never (3.1.1 has no option: 0).
      const rh = v5.rh ?? 0;
      for (const pattern of patterns) {
        const existed = this.subscriptions.has(pattern);
        this.startSubscription(pattern, s.topic, options);
        if (rh === 0 || (rh === 1 && !existed)) retained.push([pattern, options]);
      }
    }
    this.send({ cmd: "suback", messageId: p.messageId, granted } as Packet);
    // Then the retained message of every channel each new subscription matches, retain set, at the
    // lower of its QoS and the subscription's; QoS 1 and 2 ones within the in-flight window.
    const now = Date.now();
    for (const [pattern, options] of retained) {
      const m = compilePattern(pattern);
      for (const [channel, r] of this.host.retained.matching((c) => m(c) && this.mayReceive(c) && !hiddenFromWildcard(pattern, c), now)) {
        this.retainedOut.push({ channel, payload: r.payload, meta: r.meta, qos: Math.min(r.qos, options.qos) as 0 | 1 | 2, subId: options.id });
      }
    }
    this.sendRetained();
  }

  /** Retained messages for new subscriptions, waiting for room in the in-flight window. */
  private retainedOut: { channel: string; payload: Uint8Array; meta: MessageMeta | null; qos: 0 | 1 | 2; subId: number }[] = [];

  private sendRetained(): void {
    let i = 0;
    for (; i < this.retainedOut.length && !this.closed; i++) {
      const r = this.retainedOut[i]!;
      if (r.meta?.expires !== undefined && r.meta.expires <= Date.now()) continue; // expired while it waited
      if (r.qos > 0 && this.room() <= 0) break; // the rest when acknowledgements make room
      // Not from a subscriber's log: its acknowledgement moves no cursor, only gives its room back.
      if (r.qos > 0) this.window.take(0);
      if (!this.sendMessage(this.topicOf(r.channel), r.payload, r.meta, r.qos, true, r.subId, null, r.channel, -1, true) && r.qos > 0) this.window.give(0);
    }
    if (i > 0) this.retainedOut = this.retainedOut.slice(i);
  }

  private startSubscription(pattern: string, filter: string, options: SubscriptionOptions, kind: "durable" | "live" = this.persistent ? "durable" : "live"): void {
    const durable = kind === "durable";
    if (durable) this.host.sessions.remember(this.clientId, pattern, filter, options);
    const old = this.subscriptions.get(pattern);
    if (old) {
      // The same filter again replaces the subscription without interrupting its flow
      // (MQTT-3.8.4-3). A new reader would start over from the acknowledged cursor and send
      // what is in flight a second time, which clients that subscribe on every connect saw.
      old.options = options;
      return;
    }
    const m = this.host.messenger;
    // Persistent: a durable subscriber (messages kept while the client is away). Otherwise live only.
    const sub = durable ? m.openSubscriber(pattern, sessionName(this.clientId), { from: "latest" }) : m.openVolatileSubscriber(pattern, `${sessionName(this.clientId)}.${Bun.randomUUIDv7()}`);
    const d = new MqttSubscription(this, sub, pattern, filter, options, durable);
    this.subscriptions.set(pattern, d);
    d.start();
  }

  /** Joins the group `group` of shared subscriptions to `pattern`. */
  private joinShared(group: string, pattern: string, filter: string, options: SubscriptionOptions): void {
    const key = SharedSubscriptions.key(group, pattern);
    if (this.persistent) this.host.sessions.remember(this.clientId, `$share/${key}`, filter, options);
    const had = this.shared.get(key);
    if (had) had.options = options;
    else this.shared.set(key, this.host.shared.join(this.clientId, this, group, pattern, options));
  }

  /** Leaves a shared subscription: what it had unacknowledged goes to another member. */
  private leaveShared(key: string): boolean {
    const m = this.shared.get(key);
    if (!m) return false;
    // The group hands what this member was sent and did not acknowledge to another.
    this.host.shared.leave(m);
    this.outbound.returnTo(m, () => {});
    this.shared.delete(key);
    this.host.sessions.forget(this.clientId, `$share/${key}`);
    this.host.shared.release(this.clientId, key);
    return true;
  }

  private unsubscribe(p: IUnsubscribePacket): void {
    // MQTT 5 answers each filter: 0x00 success, 0x11 no subscription existed, 0x8F filter invalid.
    const codes: number[] = [];
    for (const filter of p.unsubscriptions) {
      let patterns: string[];
      let share: { group: string; filter: string } | null;
      try {
        share = sharedFilter(filter);
        patterns = filterToPatterns(share?.filter ?? filter);
      } catch {
        codes.push(0x8f);
        continue;
      }
      let found = false;
      for (const pattern of patterns) found = (share ? this.leaveShared(SharedSubscriptions.key(share.group, pattern)) : this.dropSubscription(pattern)) || found;
      codes.push(found ? 0x00 : 0x11);
    }
    this.send({ cmd: "unsuback", messageId: p.messageId, ...(this.version === 5 ? { granted: codes } : {}) } as Packet);
  }

  /** Ends the subscription of `pattern`, if there is one (a durable one's subscriber is deleted). */
  private dropSubscription(pattern: string): boolean {
    const d = this.subscriptions.get(pattern);
    if (!d) return false;
    d.stop();
    this.subscriptions.delete(pattern);
    if (!d.durable) this.host.messenger.dropVolatileSubscriber(d.subscriber);
    else {
      this.host.sessions.forget(this.clientId, pattern);
      void this.host.messenger
        .deleteSubscriber(pattern, sessionName(this.clientId))
        .catch((err) => this.host.logger.warn("mqtt session's subscriber not deleted", { client: this.clientId, pattern, error: String(err) }));
    }
    return true;
  }

  /**
   * @internal A stored record for subscription `from`: sent (true when at
   * QoS 1 or 2, acknowledged later) or passed over (false): the client's
   * own publish for a no-local subscription, a `$` topic for a wildcard
   * filter, an expired message, one larger than the client takes.
   */
  deliver(r: StoredEnvelope, from: SentFrom, sub: MqttSubscription): boolean {
    return this.deliverRecord(r, from, sub.options, sub.pattern, false);
  }

  /** @internal A stored record a shared subscription's group gives this member (see `deliver`). */
  deliverShared(r: StoredEnvelope, from: SentFrom, options: SubscriptionOptions, pattern: string): boolean {
    if (this.closed) return false;
    // The group's reader holds no room in this session's window: the message takes its own.
    if (options.qos > 0) this.window.take(0);
    const inFlight = this.deliverRecord(r, from, options, pattern, true);
    if (!inFlight && options.qos > 0) this.window.give(0);
    return inFlight;
  }

  private deliverRecord(r: StoredEnvelope, from: SentFrom, options: SubscriptionOptions, pattern: string, ownsRoom: boolean): boolean {
    const v = r.view;
    if (options.noLocal && publisherIs(r.body, v, this.clientIdBytes)) return false;
    if (hiddenFromWildcard(pattern, r.channel)) return false;
    // The rest of what MQTT 5 carries is decoded only when the message has any of it.
    const meta: MessageMeta | null = v.hasMeta ? decodeEnvelope(r.body, r.seq) : null;
    if (meta?.expires !== undefined && meta.expires <= Date.now()) return false;
    // At no higher QoS than it was published with (MQTT-3.8.4-8); a message that did not come
    // over MQTT has none and goes at the subscription's.
    const qos = (v.qos >= 0 && v.qos < options.qos ? v.qos : options.qos) as 0 | 1 | 2;
    const retain = options.retainAsPublished && meta?.retain === true;
    return this.sendMessage(this.topicOf(r.channel), storedPayload(r.body, v), meta, qos, retain, options.id, from, r.channel, r.seq, ownsRoom);
  }

  /**
   * Sends one PUBLISH; true when it is in flight (QoS 1 or 2) and waits for
   * the client, false when done (QoS 0) or not sent (larger than the client's
   * maximum packet size: MQTT 5 says such a message is dropped for it).
   */
  private sendMessage(
    name: TopicName,
    payload: Uint8Array,
    meta: MessageMeta | null,
    qos: 0 | 1 | 2,
    retain: boolean,
    subId: number,
    from: SentFrom | null,
    channel: string,
    seq: number,
    ownsRoom: boolean,
  ): boolean {
    // MQTT 5 topic aliases to the client, if it takes any: a topic's first message sets one, later
    // ones send only the alias (on a cellular link the topic is often most of a small message).
    const topic = name.topic;
    let alias: number | undefined;
    let wireTopic = name.bytes;
    if (this.version === 5 && this.clientAliasMax > 0 && topic.length > 2) {
      alias = this.outAliases.get(topic);
      if (alias !== undefined) wireTopic = NO_BYTES;
      else if (this.outAliases.size < this.clientAliasMax) {
        alias = this.outAliases.size + 1;
        this.outAliases.set(topic, alias);
      }
    }
    const props = this.version === 5 && (meta !== null || subId > 0 || alias !== undefined) ? encodePublishProperties(publishPropertiesOf(meta, Date.now(), subId > 0 ? [subId] : [], alias)) : null;
    const size = publishSize(wireTopic.length, payload.length, qos, this.version, props?.length ?? 1);
    if (size > this.clientMaxPacket) {
      this.host.logger.warn("mqtt message larger than the client's maximum packet size, not sent to it", { client: this.clientId, topic, bytes: size, max: this.clientMaxPacket });
      return false;
    }
    if (this.closed) return false;
    if (qos === 0) {
      this.wire.write(encodePublish(wireTopic, payload, 0, undefined, false, this.version, retain, props));
      return false;
    }
    const id = this.outbound.take({ from, channel, seq, qos, released: false, ownsRoom });
    // Only a durable subscription gets anything again (a live one's unacknowledged messages go with it).
    const durable = from?.subscription.durable === true;
    const dup = durable && this.host.sessions.sentBefore(this.clientId, channel, seq);
    if (durable) this.host.sessions.sending(this.clientId, channel, seq);
    this.wire.write(encodePublish(wireTopic, payload, qos, id, dup, this.version, retain, props));
    return true;
  }

  private puback(id: number): void {
    // Gives its room in the window back, which wakes every subscription waiting for it.
    if (this.outbound.puback(id) && this.retainedOut.length > 0) this.sendRetained();
  }

  private pubrec(id: number, reason: number): void {
    const r = this.outbound.pubrec(id, reason);
    if (r === "unknown") {
      if (this.version === 5)
        this.send({ cmd: "pubrel", messageId: id, reasonCode: 0x92 } as Packet); // packet identifier not found
      else this.send({ cmd: "pubrel", messageId: id } as Packet);
      return;
    }
    if (r === "refused") {
      if (this.retainedOut.length > 0) this.sendRetained();
      return;
    }
    // Owed until PUBCOMP, also after a reconnect or a restart.
    if (r === "released" && this.persistent) void this.host.sessions.releasing(this.clientId, id).catch(() => undefined); // logged, counted and retried by the store
    this.send({ cmd: "pubrel", messageId: id } as Packet);
  }

  private pubcomp(id: number): void {
    if (!this.outbound.pubcomp(id)) return;
    this.host.sessions.released(this.clientId, id);
    if (this.retainedOut.length > 0) this.sendRetained();
  }
}
