/**
 * A hub tier's storage: a NATS JetStream cluster (docs/scale-out.md). The
 * engine keeps one NATS connection, provisions the configured streams, and
 * stores records with their keyop id as `Nats-Msg-Id`, so a record sent
 * twice (a hub that died before acknowledging, a board retrying through
 * another hub) is stored once. It knows whether the cluster takes writes:
 * a hub refuses sessions while it does not, and never keeps a local spool.
 */
import { readFileSync } from "node:fs";
import {
  connect,
  DeliverPolicy,
  credsAuthenticator,
  DiscardPolicy,
  Events,
  headers as natsHeaders,
  type JetStreamClient,
  type JetStreamManager,
  type JsMsg,
  type KV,
  type MsgHdrs,
  type MsgRequest,
  type NatsConnection,
  nanos,
  RetentionPolicy,
  StorageType,
  type StreamConfig as NatsStreamConfig,
} from "nats";
import type { JetStreamConfig, StreamConfig } from "../config/jetstream.ts";
import { decodeEnvelope, toWire } from "../envelope/envelope.ts";
import { toJson } from "../envelope/json.ts";
import { EngineUnavailableError } from "../errors.ts";
import type { HubStore, SinkRecord } from "../federation/sink.ts";
import type { Logger } from "../observability/logger.ts";
import type { StreamMessage } from "./foreign.ts";
import { LiveFeed } from "./live-feed.ts";
import { KvPositions } from "./positions.ts";
import type { StreamSource } from "./stream-forwarder.ts";
import { channelSubject, patternSubject } from "./subjects.ts";

/** The key-value bucket of board positions (keys carry the tier's name, so tiers may share a cluster). */
export const POSITIONS_BUCKET = "keyop_positions";

/** How long making a consumer may take before the session reading it gives up. */
const CONSUMER_START_MS = 15_000;

/** `p`, or an EngineUnavailableError after `ms`. */
async function withDeadline<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new EngineUnavailableError(what)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

/** Messages a caught-up session may fall behind the live feed before it reads from a consumer of its own again. */
const TAP_LIMIT = 1024;

const utf8 = new TextEncoder();

/** The stored envelope as the HTTP API's JSON (without the seq, which is the stream's). */
function jsonBody(body: Uint8Array): Uint8Array {
  const { seq: _seq, ...wire } = toWire(decodeEnvelope(body, 0));
  return utf8.encode(toJson(wire));
}

function streamMessage(m: JsMsg): StreamMessage & { pending: number } {
  return {
    subject: m.subject,
    data: m.data,
    seq: m.seq,
    timestampMs: m.info.timestampNanos / 1e6,
    pending: m.info.pending,
    header: (name: string) => m.headers?.get(name) || undefined,
  };
}

/** Timings of an engine (tests shorten them). */
export interface EngineTimings {
  /** One publish waits this long for its PubAck before it is sent again. */
  publishTimeoutMs: number;
  /**
   * A record is sent again (same id) for this long before the engine gives
   * up and calls the cluster unavailable: long enough for a stream leader
   * election, short enough that a board does not wait on a dead cluster.
   */
  retryForMs: number;
  /** While unavailable, how often the engine asks the cluster whether it takes writes again. */
  probeMs: number;
  /**
   * While available, how often it asks whether the cluster still has its
   * quorum: a hub whose server is up but whose cluster lost quorum would
   * otherwise take sessions it cannot store for, until a publish failed.
   */
  healthMs: number;
}

export const DEFAULT_TIMINGS: EngineTimings = { publishTimeoutMs: 2000, retryForMs: 15_000, probeMs: 1000, healthMs: 5000 };

/** What the engine is doing, for status and for a hub deciding whether to take a session. */
export type EngineState = "connecting" | "available" | "unavailable" | "closed";

/** The stream settings keyop asks JetStream for. */
export function natsStreamConfig(s: StreamConfig, cfg: Pick<JetStreamConfig, "subjectPrefix" | "duplicateWindowMs">): Partial<NatsStreamConfig> & { name: string } {
  return {
    name: s.name,
    subjects: s.channels.map((c) => patternSubject(cfg.subjectPrefix, c)),
    num_replicas: s.replicas,
    max_age: s.maxAgeMs === undefined ? 0 : nanos(s.maxAgeMs),
    max_bytes: s.maxBytes ?? -1,
    duplicate_window: nanos(cfg.duplicateWindowMs),
    storage: StorageType.File,
    retention: RetentionPolicy.Limits,
    discard: DiscardPolicy.Old,
  };
}

/** The JetStream cluster of a hub tier; also the RecordSink its receivers store into. */
export class JetStreamEngine implements HubStore, StreamSource {
  private readonly cfg: JetStreamConfig;
  private readonly logger: Logger;
  private readonly t: EngineTimings;
  private nc: NatsConnection | null = null;
  private js: JetStreamClient | null = null;
  private jsm: JetStreamManager | null = null;
  private _state: EngineState = "connecting";
  private reason = "connecting to the cluster";
  private probing: ReturnType<typeof setTimeout> | null = null;
  private checking: ReturnType<typeof setTimeout> | null = null;
  private kv: KV | null = null;
  private readonly feeds = new Map<string, Promise<LiveFeed>>();
  /** The live feeds' loops: awaited at close, so that their consumers are deleted before the connection goes. */
  private readonly feedLoops = new Set<Promise<void>>();
  private positionStore: KvPositions | null = null;
  private readonly closing = new AbortController();
  private readonly listeners = new Set<(s: EngineState) => void>();
  /**
   * Records stored, records JetStream already had (dropped as duplicates),
   * publishes sent again, stream messages boards missed because their
   * position was older than the stream's first message, consumers made for
   * sessions that were behind, and switches of sessions to a live feed.
   */
  readonly stats = { stored: 0, duplicates: 0, retries: 0, expired: 0, catchUps: 0, live: 0 };

  constructor(cfg: JetStreamConfig, logger: Logger, timings: Partial<EngineTimings> = {}) {
    this.cfg = cfg;
    this.logger = logger;
    this.t = { ...DEFAULT_TIMINGS, ...timings };
  }

  /** Connects in the background (retrying for ever) and provisions the streams; see `state`. */
  start(): void {
    void this.run();
  }

  get state(): EngineState {
    return this._state;
  }

  /** Why the engine is not available (or "" when it is). */
  get why(): string {
    return this._state === "available" ? "" : this.reason;
  }

  unavailable(): string | null {
    return this._state === "available" ? null : this.why;
  }

  /** Calls `fn` on every change of state; returns the remover. */
  onState(fn: (s: EngineState) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  /** Resolves once available, rejects on `signal` or when closed. */
  async ready(signal?: AbortSignal): Promise<void> {
    if (this._state === "available") return;
    await new Promise<void>((resolve, reject) => {
      const off = this.onState((s) => {
        if (s === "available") done(resolve);
        else if (s === "closed") done(() => reject(new EngineUnavailableError("engine closed")));
      });
      const abort = () => done(() => reject(new EngineUnavailableError("gave up waiting for JetStream")));
      const done = (f: () => void) => {
        off();
        signal?.removeEventListener("abort", abort);
        f();
      };
      signal?.addEventListener("abort", abort, { once: true });
    });
  }

  private setState(s: EngineState, reason = ""): void {
    if (this._state === "closed") return;
    const changed = s !== this._state;
    this._state = s;
    if (reason) this.reason = reason;
    if (!changed) return;
    if (s === "available") this.logger.info("jetstream available", { servers: this.cfg.servers });
    else if (s === "unavailable") this.logger.warn("jetstream unavailable: sessions are refused and nothing is acknowledged until it is back", { reason: this.reason });
    for (const l of [...this.listeners]) l(s);
    if (s === "unavailable") this.probeSoon();
    if (s === "available") this.checkSoon();
  }

  /** While available: asks the JetStream meta leader (which needs a quorum) for the account's info. */
  private checkSoon(): void {
    if (this.checking || this._state !== "available" || !this.jsm) return;
    this.checking = setTimeout(async () => {
      this.checking = null;
      const jsm = this.jsm;
      if (!jsm || this._state !== "available") return;
      try {
        await jsm.getAccountInfo();
        this.checkSoon();
      } catch (err) {
        if ((this._state as EngineState) === "available") this.setState("unavailable", `the cluster does not answer (quorum lost?): ${String(err)}`);
      }
    }, this.t.healthMs);
    this.checking.unref?.();
  }

  private async run(): Promise<void> {
    const { cfg } = this;
    try {
      this.nc = await connect({
        servers: cfg.servers.map((s) => s.replace(/^nats:\/\//, "")),
        name: "keyop-hub",
        waitOnFirstConnect: true,
        maxReconnectAttempts: -1,
        reconnectTimeWait: 1000,
        pingInterval: 10_000,
        ...(cfg.user !== undefined ? { user: cfg.user, pass: cfg.password } : {}),
        ...(cfg.creds !== undefined ? { authenticator: credsAuthenticator(readFileSync(cfg.creds)) } : {}),
        ...(cfg.tls ? { tls: { certFile: cfg.tls.cert, keyFile: cfg.tls.key, caFile: cfg.tls.ca } } : {}),
      });
    } catch (err) {
      if (this.closing.signal.aborted) return;
      this.logger.error("cannot connect to jetstream (check hub.jetstream)", { error: String(err) });
      this.setState("unavailable", `cannot connect: ${String(err)}`);
      return;
    }
    if (this.closing.signal.aborted) {
      await this.nc.close();
      return;
    }
    this.js = this.nc.jetstream();
    this.jsm = await this.nc.jetstreamManager({ checkAPI: false });
    void this.watch(this.nc);
    await this.probe();
  }

  /** Follows the connection: a disconnect makes the engine unavailable, a reconnect probes. */
  private async watch(nc: NatsConnection): Promise<void> {
    for await (const s of nc.status()) {
      if (s.type === Events.Disconnect) this.setState("unavailable", `disconnected from ${String(s.data)}`);
      else if (s.type === Events.Reconnect) void this.probe();
    }
  }

  private probeSoon(): void {
    if (this.probing || this._state !== "unavailable" || !this.jsm) return;
    this.probing = setTimeout(() => {
      this.probing = null;
      void this.probe();
    }, this.t.probeMs);
  }

  /** Makes sure every stream exists as configured; available when the cluster answered for all. */
  private async probe(): Promise<void> {
    const jsm = this.jsm;
    if (!jsm || this._state === "closed") return;
    try {
      // A server left alone after its cluster lost quorum still answers a stream's info from its own
      // copy (with no leader): only the meta leader's answer and a leader per stream mean writes land.
      await jsm.getAccountInfo();
      for (const s of this.cfg.streams) await this.provision(jsm, s);
      if (!this.kv) {
        const replicas = Math.max(...this.cfg.streams.map((s) => s.replicas));
        this.kv = await this.js!.views.kv(POSITIONS_BUCKET, { replicas, history: 1 });
        this.positionStore = new KvPositions(this.kv, this.logger);
      }
      this.setState("available");
    } catch (err) {
      this.setState("unavailable", `streams not ready: ${err instanceof Error ? err.message : String(err)}`);
      this.probeSoon();
    }
  }

  private async provision(jsm: JetStreamManager, s: StreamConfig): Promise<void> {
    const want = natsStreamConfig(s, this.cfg);
    let info: Awaited<ReturnType<JetStreamManager["streams"]["info"]>> | null = null;
    try {
      info = await jsm.streams.info(s.name);
    } catch (err) {
      if (!/stream not found/i.test(String(err))) throw err;
    }
    if (!info) {
      await jsm.streams.add(want);
      this.logger.info("jetstream stream created", { stream: s.name, subjects: want.subjects, replicas: s.replicas });
      return;
    }
    if (info.cluster && !info.cluster.leader) throw new Error(`stream ${s.name} has no leader`);
    const c = info.config;
    const same =
      JSON.stringify([...(c.subjects ?? [])].sort()) === JSON.stringify([...want.subjects!].sort()) &&
      c.num_replicas === want.num_replicas &&
      c.max_age === want.max_age &&
      c.max_bytes === want.max_bytes &&
      c.duplicate_window === want.duplicate_window;
    if (!same) {
      await jsm.streams.update(s.name, want);
      this.logger.info("jetstream stream updated to the configuration", { stream: s.name, subjects: want.subjects, replicas: s.replicas });
    }
  }

  /**
   * Publishes every record to its channel's subject with its id as
   * `Nats-Msg-Id`, all at once, and resolves when every one has its
   * PubAck (stored, or a duplicate JetStream already had).
   */
  async store(channel: string, records: readonly SinkRecord[]): Promise<void> {
    // Not refused while merely unavailable: a reconnect to another server or a leader election
    // is what the retries are for; a cluster that stays down fails them (and the session).
    if (this._state === "closed" || !this.js) throw new EngineUnavailableError(`jetstream is not connected: ${this.why}`);
    const subject = channelSubject(this.cfg.subjectPrefix, channel);
    const json = this.cfg.format === "json";
    await Promise.all(records.map((r) => this.publish(subject, json ? { id: r.id, body: jsonBody(r.body) } : r, this.cfg.headers ? this.headersOf(r.body) : undefined)));
  }

  private async publish(subject: string, r: SinkRecord, hdrs: MsgHdrs | undefined): Promise<void> {
    const deadline = performance.now() + this.t.retryForMs;
    for (let attempt = 0; ; attempt++) {
      const js = this.js;
      if (this._state === "closed" || !js) throw new EngineUnavailableError("engine closed");
      try {
        const ack = await js.publish(subject, r.body, { msgID: r.id, timeout: this.t.publishTimeoutMs, ...(hdrs ? { headers: hdrs } : {}) });
        if (ack.duplicate) this.stats.duplicates++;
        else this.stats.stored++;
        return;
      } catch (err) {
        // A leader election or a lost server: the same id again is safe, JetStream drops a second copy.
        const left = deadline - performance.now();
        if (left <= 0 || (this._state as EngineState) === "closed") {
          this.setState("unavailable", `publish to ${subject} failed for ${this.t.retryForMs} ms: ${String(err)}`);
          throw new EngineUnavailableError(`jetstream did not store ${subject}: ${String(err)}`, err);
        }
        this.stats.retries++;
        await Bun.sleep(Math.min(left, 100 * 2 ** Math.min(attempt, 4)));
      }
    }
  }

  /** Headers for readers outside keyop; only made when `headers` is on. */
  private headersOf(body: Uint8Array) {
    const h = natsHeaders();
    try {
      const m = decodeEnvelope(body, 0);
      h.set("Keyop-Type", m.type);
      h.set("Keyop-Origin", m.origin);
      if (m.correlationId) h.set("Keyop-Correlation-Id", m.correlationId);
    } catch {
      // the receiver checked the envelope; a body it kept always decodes
    }
    return h;
  }

  /** Board positions (once the engine was available). */
  get positions(): KvPositions | null {
    return this.positionStore;
  }

  /**
   * Publishes a reply to a NATS client's request on its subject (core NATS:
   * a reply is not stored). The payload as JSON text (bytes as they are),
   * the envelope's labels as headers. False when not connected.
   */
  publishReply(subject: string, reply: Uint8Array): boolean {
    const nc = this.nc;
    if (!nc || nc.isClosed()) return false;
    const m = decodeEnvelope(reply, 0);
    const h = natsHeaders();
    h.set("Keyop-Id", m.id);
    h.set("Keyop-Type", m.type);
    h.set("Keyop-Origin", m.origin);
    if (m.correlationId !== undefined) h.set("Keyop-Correlation-Id", m.correlationId);
    const data = m.payload instanceof Uint8Array ? m.payload : new TextEncoder().encode(toJson(m.payload ?? null));
    nc.publish(subject, data, { headers: h });
    return true;
  }

  /** The configuration the engine runs (streams, prefix). */
  get config(): JetStreamConfig {
    return this.cfg;
  }

  async bounds(stream: string): Promise<{ first: number; last: number }> {
    if (!this.jsm) throw new EngineUnavailableError("jetstream is not connected");
    const i = await this.jsm.streams.info(stream);
    return { first: i.state.first_seq, last: i.state.last_seq };
  }

  /**
   * The messages of `stream` from `from` on (matching `filter`), for one
   * session: from a consumer of its own while it is behind, then from this
   * hub's live feed of the stream once it has caught up (and back to a
   * consumer of its own if it falls too far behind the feed).
   */
  async *read(stream: string, from: number, filter: string | undefined, signal: AbortSignal): AsyncIterable<StreamMessage & { pending: number }> {
    const subject = filter ?? `${this.cfg.subjectPrefix}.>`;
    let next = Math.max(1, from);
    while (!signal.aborted) {
      const feed = await this.feedFor(stream);
      if (feed.isEnded) {
        // Its consumer stopped; the next call starts another (after a pause, not in a spin).
        if (this.feeds.get(stream) !== undefined && (await this.feeds.get(stream)) === feed) this.feeds.delete(stream);
        await Bun.sleep(100);
        continue;
      }
      // Registered before the catch-up: it holds whatever the feed delivers meanwhile.
      let tap = feed.tap(subject);
      const end = () => tap.end();
      signal.addEventListener("abort", end, { once: true });
      try {
        if (await this.storedFrom(stream, next, subject)) {
          for await (const m of this.consume(stream, next, filter, signal)) {
            if (m.seq < next) continue;
            next = m.seq + 1;
            yield m;
            if (m.pending > 0) continue;
            // Nothing more stored for this session: what comes next is in the tap, unless it overflowed
            // meanwhile; then a fresh tap, and the catch-up goes on to the next time it runs dry.
            if (!tap.overflowed) break;
            tap.close();
            tap = feed.tap(subject);
          }
        }
        if (signal.aborted) return;
        this.stats.live++;
        for (let m = await tap.next(); m !== null; m = await tap.next()) {
          if (m.seq < next) continue;
          next = m.seq + 1;
          yield { ...m, pending: 0 };
        }
        // The tap overflowed (a slow board) or the feed stopped: catch up on a consumer again.
      } finally {
        signal.removeEventListener("abort", end);
        tap.close();
      }
    }
  }

  /** Whether a message matching `subject` is stored at `seq` or after. */
  private async storedFrom(stream: string, seq: number, subject: string): Promise<boolean> {
    if (!this.jsm) throw new EngineUnavailableError("jetstream is not connected");
    try {
      // STREAM.MSG.GET with next_by_subj (nats-server 2.9): the first matching message at or after seq.
      await this.jsm.streams.getMessage(stream, { seq, next_by_subj: subject } as unknown as MsgRequest);
      return true;
    } catch (err) {
      if (/no message found/i.test(String(err))) return false;
      throw err;
    }
  }

  /**
   * An ordered consumer from `from`: ephemeral, in memory on one server, no
   * acks (the board's ACKs move its position instead); it re-creates itself
   * where it was after a server or the connection is lost.
   */
  private async *consume(stream: string, from: number, filter: string | undefined, signal: AbortSignal): AsyncIterable<StreamMessage & { pending: number }> {
    if (!this.js) throw new EngineUnavailableError("jetstream is not connected");
    // Deleted when done: left to the server's inactive threshold, a fleet of boards on flaky links
    // piled them up. (Only a hub that dies leaves its consumers to it: nats.js gives ordered
    // consumers 5 minutes, and ignores a shorter one for a consumer that starts at a sequence.)
    const js = this.js;
    // Bounded: during a leader election the library can wait a long time to make a consumer; the
    // session then ends (unavailable) and the board comes back, rather than standing still.
    const { consumer, msgs } = await withDeadline(
      (async () => {
        const consumer = await js.consumers.get(stream, {
          deliver_policy: DeliverPolicy.StartSequence,
          opt_start_seq: Math.max(1, from),
          ...(filter ? { filterSubjects: filter } : {}),
        });
        // Heartbeats every second: a consumer on a server that died is noticed after two missed
        // ones and made again where it was (by default that took a minute, and a feed stood still).
        return { consumer, msgs: await consumer.consume({ max_messages: 256, expires: 10_000, idle_heartbeat: 1000 }) };
      })(),
      CONSUMER_START_MS,
      `no consumer of ${stream} within ${CONSUMER_START_MS} ms`,
    );
    const stop = () => msgs.stop();
    signal.addEventListener("abort", stop, { once: true });
    this.stats.catchUps++;
    try {
      for await (const m of msgs) yield streamMessage(m);
    } finally {
      signal.removeEventListener("abort", stop);
      msgs.stop();
      await consumer.delete().catch(() => {});
    }
  }

  /** This hub's live feed of `stream`: one ordered consumer from the stream's end, shared by every caught-up session. */
  private feedFor(stream: string): Promise<LiveFeed> {
    let f = this.feeds.get(stream);
    if (!f) {
      f = this.startFeed(stream);
      this.feeds.set(stream, f);
      // A feed that could not start is tried again by the next reader.
      f.catch(() => this.feeds.delete(stream));
    }
    return f;
  }

  private async startFeed(stream: string): Promise<LiveFeed> {
    const { last } = await this.bounds(stream);
    const feed = new LiveFeed(last, TAP_LIMIT);
    const running = (async () => {
      try {
        for await (const m of this.consume(stream, last + 1, undefined, this.closing.signal)) feed.deliver(m);
      } catch (err) {
        this.logger.warn("a live feed of a stream stopped (sessions read their own consumers until the next one starts)", { stream, error: String(err) });
      } finally {
        if (this.feeds.get(stream) && (await this.feeds.get(stream)) === feed) this.feeds.delete(stream);
        feed.end();
      }
    })();
    this.feedLoops.add(running);
    void running.finally(() => this.feedLoops.delete(running));
    return feed;
  }

  /** Closes the connection; later stores reject. */
  async close(): Promise<void> {
    this.closing.abort();
    if (this.probing) clearTimeout(this.probing);
    if (this.checking) clearTimeout(this.checking);
    this._state = "closed";
    for (const l of [...this.listeners]) l("closed");
    await Promise.race([Promise.all(this.feedLoops), Bun.sleep(2000)]);
    const nc = this.nc;
    this.nc = null;
    this.js = null;
    if (nc && !nc.isClosed()) await nc.drain().catch(() => nc.close());
  }
}
