/**
 * One MQTT client connection: the session rules on top of mqtt-packet's
 * parser and generator. Publishes go into the durable log (a QoS 1 PUBACK
 * only after the write is durable); subscriptions read the log through a
 * durable subscriber named `mqtt.<client id>` (persistent session) or a
 * volatile one (clean session), so a client that was away gets what it
 * missed, and unacknowledged QoS 1 messages come again.
 */
import mqtt from "mqtt-packet";
import type { IConnectPacket, IPublishPacket, ISubscribePacket, IUnsubscribePacket, Packet } from "mqtt-packet";
import type { Message } from "../envelope/envelope.ts";
import type { Messenger } from "../messenger/messenger.ts";
import { Window } from "../messenger/window.ts";
import { bytesOf, payloadOf, pubackBytes } from "./payload.ts";
import { decodeFast, encodePublish, type Frame, MqttFramer, MqttFrameError } from "./codec.ts";
import { MqttSubscription, type SentFrom } from "./subscription.ts";
import type { Logger } from "../observability/logger.ts";
import type { MqttConfig } from "../config/schema.ts";
import { channelToTopic, filterToPatterns, hiddenFromWildcard, topicToChannel } from "./topics.ts";
import type { RetainedStore } from "./retained.ts";
import type { SessionStore } from "./session-store.ts";
import { compilePattern, compileRules } from "../envelope/names.ts";

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
}

/** The socket operations a session uses. */
export interface Wire {
  /** Queues bytes; false when the client is behind (more than the high-water mark queued). */
  write(bytes: Uint8Array): boolean;
  /** Resolves once the client has caught up below the high-water mark. */
  writable(): Promise<void>;
  end(): void;
}

/** Durable subscriber name of a persistent MQTT session. */
export function sessionName(clientId: string): string {
  // Three disjoint forms, so no two ids share a session: readable for the ids that were always
  // allowed ("mqtt." + id), hex of the UTF-8 for any other id short enough ("mqtt-x."), and a
  // SHA-256 for a longer one ("mqtt-h.": names are at most 128 bytes).
  if (PLAIN_CLIENT_ID.test(clientId)) return `mqtt.${clientId}`;
  const bytes = new TextEncoder().encode(clientId);
  if (bytes.length <= 56) return `mqtt-x.${Buffer.from(bytes).toString("hex")}`;
  return `mqtt-h.${new Bun.CryptoHasher("sha256").update(bytes).digest("hex")}`;
}

/**
 * Packets handled per turn of the event loop. A client's window of QoS 1
 * publishes often arrives in one read; stored all in that turn, they share
 * one fdatasync and come back as one burst of PUBACKs, and the client and
 * the disk take turns idling. In groups, the first group's fdatasync runs
 * while the next is encoded and its PUBACKs reach the client while later
 * groups wait for their own (docs/benchmarks.md has the figures).
 */
const PUMP_PACKETS = 16;
/** Parsed packets allowed to wait: past this a turn handles the excess too (a flooding client). */
const MAX_WAITING_PACKETS = 1024;

/** Client ids kept as they are in their session's name (what keyop accepted before any UTF-8 id). */
const PLAIN_CLIENT_ID = /^[A-Za-z0-9_.-]{1,100}$/;

/** A QoS 1 message sent to the client and not yet acknowledged. */
interface InFlight {
  /** The subscription and its reader's delivery it came from; null for a retained message sent on subscribe. */
  from: SentFrom | null;
  channel: string;
  seq: number;
}

/** A publish waiting for its write to be durable before its acknowledgement. */
interface PendingAck {
  id: number | undefined;
  qos: number;
  done: boolean;
  error: unknown;
}

/** An MQTT client connection and its session state. */
export class MqttSession {
  readonly host: SessionHost;
  private readonly wire: Wire;
  private readonly parser: ReturnType<typeof mqtt.parser>;
  private readonly framer: MqttFramer;
  private version: 3 | 4 | 5 = 4;
  private clientId = "";
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
  /** QoS 1 messages sent and not acknowledged, by packet id. */
  private readonly inflight = new Map<number, InFlight>();
  /** QoS 1 messages in flight to the client, over every subscription and retained messages. */
  readonly window: Window;
  private nextId = 1;
  /** QoS 2 publishes stored and not yet released, by packet id. */
  private readonly qos2 = new Map<number, Promise<unknown>>();
  /** The logged-in user's rules (null: no users configured, everything allowed). */
  private mayPublish: ((channel: string) => boolean) | null = null;
  private maySubscribe: ((channel: string) => boolean) | null = null;

  constructor(host: SessionHost, wire: Wire) {
    this.host = host;
    this.wire = wire;
    this.window = new Window(Math.min(host.cfg.maxInflight, this.clientReceiveMax));
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
      frames = this.framer.feed(Buffer.from(chunk));
    } catch (err) {
      return this.fail((err as Error).message, err instanceof MqttFrameError ? err.reason : 0x81);
    }
    for (const f of frames) {
      // The message path's packets by hand once connected; the rest (and a CONNECT's version) by mqtt-packet.
      const p = this.connected ? decodeFast(f, this.version) : null;
      if (p) this.incoming.push(p);
      else this.parser.parse(f.bytes);
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
    try {
      for (let i = 0; i < n && !this.closed; i++) this.packet(this.incoming[i]!);
    } catch (err) {
      // Whatever a client sends, the process goes on: that connection ends.
      this.fail(`internal error: ${String(err)}`);
    } finally {
      this.incoming.splice(0, n);
    }
  }

  private send(p: Packet): void {
    if (this.closed) return;
    this.wire.write(mqtt.generate(p, { protocolVersion: this.version }));
  }

  /** Ends the connection with a reason (v5 DISCONNECT code when known); the will is published. */
  fail(reason: string, code = 0x81): void {
    if (this.closed) return;
    this.host.logger.warn("mqtt client dropped", { client: this.clientId || undefined, reason });
    if (this.connected && this.version === 5) this.send({ cmd: "disconnect", reasonCode: code } as Packet);
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
    if (this.timer) clearInterval(this.timer);
    let durable = false;
    for (const d of this.subscriptions.values()) {
      d.stop();
      if (!d.durable) this.host.messenger.dropVolatileSubscriber(d.subscriber);
      durable ||= d.durable;
    }
    this.subscriptions.clear();
    this.inflight.clear();
    this.retainedOut = [];
    if (this.connected) {
      // Unless a newer connection of the same client id took the session over, its life after
      // this connection starts now: kept for expiryMs, or ended at once.
      const mine = this.host.owner(this.clientId) === this;
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
      void this.store(w.topic, Buffer.from(w.payload), w.retain ? (w.qos ?? 0) : undefined).catch((err) =>
        this.host.logger.warn("mqtt will not published", { client: this.clientId, error: String(err) }),
      );
    }
    this.wire.end();
  }

  /** Whether the logged-in user may receive messages of `channel`. */
  mayReceive(channel: string): boolean {
    return !this.maySubscribe || this.maySubscribe(channel);
  }

  /** Resolves when the client's socket has room again. */
  writable(): Promise<void> {
    return this.wire.writable();
  }

  /** Room for more QoS 1 messages in flight to this client. */
  room(): number {
    return this.window.room();
  }

  /** MQTT 5 CONNECT: QoS 1 messages the client takes unacknowledged, and its largest packet. */
  private clientReceiveMax = 65_535;
  private clientMaxPacket = Number.POSITIVE_INFINITY;

  /** Bytes of the PUBLISH keyop sends for `topic` and a payload of `payloadBytes` (it adds no properties). */
  private publishSize(topic: string, payloadBytes: number, qos: number): number {
    const rest = 2 + Buffer.byteLength(topic) + (qos > 0 ? 2 : 0) + (this.version === 5 ? 1 : 0) + payloadBytes;
    return 1 + (rest < 128 ? 1 : rest < 16_384 ? 2 : rest < 2_097_152 ? 3 : 4) + rest;
  }

  /** Whether the client takes a packet that big; if not, says so in the log (MQTT 5: such a message is dropped for it). */
  private fits(topic: string, payloadBytes: number, qos: number): boolean {
    const size = this.publishSize(topic, payloadBytes, qos);
    if (size <= this.clientMaxPacket) return true;
    this.host.logger.warn("mqtt message larger than the client's maximum packet size, not sent to it", { client: this.clientId, topic, bytes: size, max: this.clientMaxPacket });
    return false;
  }

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

  private connect(p: IConnectPacket): void {
    if (this.connected || this.connecting) return this.fail("second CONNECT");
    const users = this.host.cfg.users;
    if (users.length === 0) return this.accept(p);
    // Logins are checked off the packet path (password hashes are slow on purpose); what the
    // client sends meanwhile waits.
    this.connecting = true;
    const user = users.find((u) => u.name === p.username);
    const password = p.password ? Buffer.from(p.password).toString("utf8") : "";
    void (user ? Bun.password.verify(password, user.passwordHash).catch(() => false) : Promise.resolve(false)).then((ok) => {
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
      this.accept(p);
      for (const q of this.waiting.splice(0)) this.packet(q);
    });
  }

  private connecting = false;
  /** The client sent an empty client id and keyop made one up. */
  private assignedId = false;
  private readonly waiting: Packet[] = [];

  private accept(p: IConnectPacket): void {
    this.version = p.protocolVersion === 5 ? 5 : p.protocolVersion === 3 ? 3 : 4;
    const refuse = (v5: number, v4: number, why: string) => {
      this.host.logger.warn("mqtt connect refused", { client: p.clientId, reason: why });
      this.send(this.version === 5 ? ({ cmd: "connack", reasonCode: v5, sessionPresent: false } as Packet) : ({ cmd: "connack", returnCode: v4, sessionPresent: false } as Packet));
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
    const cleanStart = p.clean !== false;
    // 3.1.1: clean session 0 keeps the session for mqtt.session_expiry. MQTT 5: clean start and
    // session expiry are apart; the client asks for an expiry (none: 0), capped by the config.
    const asked = (p.properties as { sessionExpiryInterval?: number } | undefined)?.sessionExpiryInterval;
    this.expiryMs = this.version === 5 ? this.expiryFor(asked ?? 0) : cleanStart ? 0 : this.host.cfg.sessionExpiryMs;
    this.will = p.will;
    if (this.will) {
      try {
        topicToChannel(this.will.topic);
      } catch (err) {
        // MQTT 5 says why (topic name invalid); 3.1.1 has no code for it (2 would blame the client
        // id), so the connection closes, as for a publish to a bad topic.
        if (this.version === 5) return refuse(0x90, 2, `will topic: ${String(err)}`);
        this.host.logger.warn("mqtt connect refused", { client: p.clientId, reason: `will topic: ${String(err)}` });
        return this.shutdown(false);
      }
    }
    this.keepalive = p.keepalive ?? 0;
    const props = p.properties as { receiveMaximum?: number; maximumPacketSize?: number } | undefined;
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
    const props: Record<string, number | string> = { maximumPacketSize: this.host.cfg.maxPacketBytes, receiveMaximum: 65_535 };
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
      const name = sessionName(id);
      for (const s of this.host.messenger.subscribers()) {
        if (s.name === name) this.startSubscription(s.pattern, 1, "durable");
      }
    }
  }

  /** Publishes a will; `retainQos` set: it also becomes the channel's retained message. */
  private async store(topic: string, payload: Buffer, retainQos?: number): Promise<void> {
    const channel = topicToChannel(topic);
    await this.host.messenger.publish(channel, this.host.cfg.payloadType, payloadOf(payload));
    if (retainQos !== undefined) await this.host.retained.set(channel, payload, retainQos);
  }

  private publish(p: IPublishPacket): void {
    const qos = p.qos ?? 0;
    const id = p.messageId;
    let channel: string;
    try {
      channel = topicToChannel(p.topic);
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
    const earlier = qos === 2 && id !== undefined ? this.qos2.get(id) : undefined;
    if (earlier) {
      // The same QoS 2 publish again before PUBREL: not stored twice; PUBREC once the first is durable.
      const again: PendingAck = { id, qos, done: false, error: undefined };
      this.acks.push(again);
      earlier.then(
        () => this.settle(again, undefined),
        (err: unknown) => this.settle(again, err),
      );
      return;
    }
    const payload = payloadOf(p.payload as Buffer);
    // Stored at once, so that publishes in flight together share one group commit (the log keeps
    // their order); the acknowledgements go out in the order the publishes came, each once its
    // own write (and, for a retained one, the retained copy) is durable.
    const ack: PendingAck = { id, qos, done: false, error: undefined };
    this.acks.push(ack);
    let stored: Promise<unknown> = this.host.messenger.publish(channel, this.host.cfg.payloadType, payload);
    if (p.retain) stored = stored.then(() => this.host.retained.set(channel, p.payload as Buffer, qos));
    // A QoS 2 packet id is taken from now until PUBREL (or until its write fails).
    if (qos === 2 && id !== undefined) this.qos2.set(id, stored);
    stored.then(
      () => this.settle(ack, undefined),
      (err: unknown) => this.settle(ack, err),
    );
  }

  /** Pending acknowledgements, in the order their publishes came. */
  private readonly acks: PendingAck[] = [];

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
          this.send({ cmd: a.qos === 1 ? "puback" : "pubrec", messageId: a.id, reasonCode: code === "disk_full" ? 0x97 : 0x80 } as Packet);
          continue;
        }
        return this.fail(`publish failed: ${String(a.error)}`);
      }
      // Only now, with the message durable, the acknowledgement.
      if (a.qos === 1) this.wire.write(pubackBytes(a.id!));
      else if (a.qos === 2 && a.id !== undefined) {
        this.send({ cmd: "pubrec", messageId: a.id } as Packet);
      }
    }
  }

  private subscribe(p: ISubscribePacket): void {
    const granted: number[] = [];
    const retained: [string, 0 | 1][] = [];
    for (const s of p.subscriptions) {
      let patterns: string[];
      try {
        patterns = filterToPatterns(s.topic);
      } catch (err) {
        this.host.logger.warn("mqtt subscription refused", { client: this.clientId, filter: s.topic, error: String(err) });
        granted.push(this.version === 5 ? 0x8f : 0x80);
        continue;
      }
      const qos = (s.qos >= 1 ? 1 : 0) as 0 | 1; // QoS 2 is granted as 1
      granted.push(qos);
      // MQTT 5 retain handling: 0 sends the retained messages, 1 only for a subscription that is
      // new, 2 never (3.1.1 has no option: 0).
      const rh = this.version === 5 ? ((s as { rh?: number }).rh ?? 0) : 0;
      for (const pattern of patterns) {
        const existed = this.subscriptions.has(pattern);
        this.startSubscription(pattern, qos);
        if (rh === 0 || (rh === 1 && !existed)) retained.push([pattern, qos]);
      }
    }
    this.send({ cmd: "suback", messageId: p.messageId, granted } as Packet);
    // Then the retained message of every channel each new subscription matches, retain set, at the
    // lower of its QoS and the subscription's; QoS 1 ones within the in-flight window.
    for (const [pattern, granted] of retained) {
      const m = compilePattern(pattern);
      for (const [channel, r] of this.host.retained.matching((c) => m(c) && this.mayReceive(c) && !hiddenFromWildcard(pattern, c))) {
        this.retainedOut.push({ channel, payload: r.payload, qos: Math.min(r.qos, granted) as 0 | 1 });
      }
    }
    this.sendRetained();
  }

  /** Retained messages for new subscriptions, waiting for room in the in-flight window. */
  private retainedOut: { channel: string; payload: Uint8Array; qos: 0 | 1 }[] = [];

  private sendRetained(): void {
    let i = 0;
    for (; i < this.retainedOut.length && !this.closed; i++) {
      const r = this.retainedOut[i]!;
      if (!this.fits(channelToTopic(r.channel), r.payload.length, r.qos)) continue;
      const base = { cmd: "publish", topic: channelToTopic(r.channel), payload: Buffer.from(r.payload), retain: true, dup: false };
      if (r.qos === 0) {
        this.send({ ...base, qos: 0 } as Packet);
        continue;
      }
      if (this.room() <= 0) break; // the rest when acknowledgements make room
      // Not from a subscriber's log: its acknowledgement moves no cursor, only gives its room back.
      this.window.take(0);
      this.send({ ...base, qos: 1, messageId: this.takeId({ from: null, channel: r.channel, seq: -1 }) } as Packet);
    }
    if (i > 0) this.retainedOut = this.retainedOut.slice(i);
  }

  /** A free packet id for a QoS 1 message to the client, now in flight. */
  private takeId(f: InFlight): number {
    let id = this.nextId;
    while (this.inflight.has(id)) id = (id % 65_535) + 1;
    this.nextId = (id % 65_535) + 1;
    this.inflight.set(id, f);
    return id;
  }

  private startSubscription(pattern: string, qos: 0 | 1, kind: "durable" | "live" = this.persistent ? "durable" : "live"): void {
    const durable = kind === "durable";
    const old = this.subscriptions.get(pattern);
    if (old) {
      // The same filter again replaces the subscription without interrupting its flow
      // (MQTT-3.8.4-3). A new reader would start over from the acknowledged cursor and send
      // what is in flight a second time, which clients that subscribe on every connect saw.
      old.qos = qos;
      return;
    }
    const m = this.host.messenger;
    // Persistent: a durable subscriber (messages kept while the client is away). Otherwise live only.
    const sub = durable ? m.openSubscriber(pattern, sessionName(this.clientId), { from: "latest" }) : m.openVolatileSubscriber(pattern, `${sessionName(this.clientId)}.${Bun.randomUUIDv7()}`);
    const d = new MqttSubscription(this, sub, pattern, qos, durable);
    this.subscriptions.set(pattern, d);
    d.start();
  }

  private unsubscribe(p: IUnsubscribePacket): void {
    for (const pattern of p.unsubscriptions.flatMap((filter) => {
      try {
        return filterToPatterns(filter);
      } catch {
        return [];
      }
    })) {
      const d = this.subscriptions.get(pattern);
      if (!d) continue;
      d.stop();
      this.subscriptions.delete(pattern);
      if (!d.durable) this.host.messenger.dropVolatileSubscriber(d.subscriber);
      else
        void this.host.messenger
          .deleteSubscriber(pattern, sessionName(this.clientId))
          .catch((err) => this.host.logger.warn("mqtt session's subscriber not deleted", { client: this.clientId, pattern, error: String(err) }));
    }
    this.send({ cmd: "unsuback", messageId: p.messageId } as Packet);
  }

  /** @internal Sends one stored message to the client. */
  deliver(m: Message, qos: 0 | 1, from: SentFrom | null): void {
    const topic = channelToTopic(m.channel);
    const payload = bytesOf(m.payload);
    if (!this.fits(topic, payload.length, qos) || (from && hiddenFromWildcard(from.subscription.pattern, m.channel))) {
      // Counted as delivered: the cursor moves past it.
      if (qos === 1 && from) from.subscription.acked(from.delivery);
      return;
    }
    if (qos === 0 || !from) {
      if (!this.closed) this.wire.write(encodePublish(topic, payload, 0, undefined, false, this.version));
      return;
    }
    const id = this.takeId({ from, channel: m.channel, seq: m.seq });
    // Only a durable subscription gets anything again (a live one's unacknowledged messages go with it).
    const durable = from.subscription.durable;
    const dup = durable && this.host.sessions.sentBefore(this.clientId, m.channel, m.seq);
    if (durable) this.host.sessions.sending(this.clientId, m.channel, m.seq);
    if (!this.closed) this.wire.write(encodePublish(topic, payload, 1, id, dup, this.version));
  }

  private puback(id: number): void {
    const f = this.inflight.get(id);
    if (!f) return;
    this.inflight.delete(id);
    // Either gives its room in the window back, which wakes every subscription waiting for it.
    if (f.from) f.from.subscription.acked(f.from.delivery);
    else this.window.give(0);
    if (this.retainedOut.length > 0) this.sendRetained();
  }
}
