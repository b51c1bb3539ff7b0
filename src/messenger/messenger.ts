/**
 * The Messenger: durable publish and subscribe on an embedded log (README, "The library").
 *
 * `publish` resolves once the record is as durable as `storage.sync` says
 * (after fdatasync with the default `always`); subscribers are durable named
 * cursors that see every message at least once, in order per channel.
 */
import { assertLabel, decodeEnvelope, encodeEnvelope, type EnvelopeFields, toWire, type Message, type MessageMeta } from "../envelope/envelope.ts";
import { assertPublishable, buildBody, buildOnCheckedChannel, type BuiltEnvelope } from "../envelope/build.ts";
import { MessageIds } from "../envelope/message-id.ts";
import { assertChannel, assertName, assertPattern, compilePattern, deadLetterOf, isDeadLetter, type Matcher } from "../envelope/names.ts";
import { BufferFullError, ClosedError, ConflictError, InvalidArgumentError, KeyopError, NoRequestError, NoRespondersError, RouteDownError, TooLargeError } from "../errors.ts";
import { Inboxes, isInbox, newInbox } from "./inbox.ts";
import { type PublishWaiter, QueuedPublish } from "./queued-publish.ts";
import { Histogram, type LatencySummary } from "../observability/histogram.ts";
import type { ChannelLog, LogHealth, RetentionPolicy } from "../store/channel-log.ts";
import { type AppliedPolicy, ChannelPolicies, type ChannelPolicy } from "./channel-policy.ts";
import { CursorStore, cursorKey, type StartFrom } from "../store/cursor-store.ts";
import { LogStore } from "../store/log-store.ts";
import { join } from "node:path";
import { resolveConfig, type MessengerConfig, type ResolvedConfig } from "./config.ts";
import { correlationIdOf, currentContext, labelledMessage, serviceNameOf } from "./context.ts";
import { Subscription, type Handler, type SubscribeOptions, type SubscriptionHost } from "./subscription.ts";
import { DurableSubscriber, type DurableSubscriberHost } from "./durable-subscriber.ts";
import { type QueueGroupStats, QueueGroups } from "./queue-group.ts";
import { QueueSubscription, type QueueSubscribeOptions } from "./queue-subscription.ts";
import { ImportIndex } from "./import-index.ts";
import { UnknownSubscriberError } from "../errors.ts";
import type { CursorState } from "../store/cursor-store.ts";

/** Per-publish overrides of the context fields. */
export interface PublishOptions {
  correlationId?: string;
  serviceName?: string;
  /** Time to live (ms): after it the message is neither delivered nor forwarded. Default: the channel's `ttl`. */
  ttlMs?: number;
  /** Protocol metadata stored with the message (MQTT 5 properties). */
  meta?: MessageMeta;
}

/** How `request` waits. */
export interface RequestOptions extends PublishOptions {
  /** How long to wait for the reply (default 5 s); the request expires then too. */
  timeoutMs?: number;
  /**
   * Store the request even when nobody is attached to answer it now (a
   * board that is offline): it waits in the log like any message, and the
   * reply comes if it is answered within the timeout.
   */
  durable?: boolean;
}

/** What a durable publish returns. */
export interface PublishResult {
  id: string;
  seq: number;
  channel: string;
  ts: number;
}

/** One entry of `publishBatch`. */
export interface BatchEntry {
  channel: string;
  type: string;
  payload: unknown;
  opts?: PublishOptions;
}

/** Counters of one channel since the messenger opened. */
export interface ChannelCounters {
  published: number;
  delivered: number;
  acked: number;
  redelivered: number;
  failed: number;
  deadLettered: number;
  /** Messages that expired before a subscriber or link got them, counted once per subscriber. */
  expired: number;
  /** Publishes refused because the channel was full (`buffer_full`). */
  rejected: number;
  /** Messages a link passed over because a newer one of the channel superseded them (`latest`). */
  superseded: number;
}

/** A subscriber as `stats()` reports it. */
export interface SubscriberStats {
  name: string;
  pattern: string;
  /** Next seq the subscriber will get on this channel. */
  cursor: number;
  /** Messages stored but not yet acked by this subscriber. */
  lag: number;
  skipped: number;
  active: boolean;
  /** While several consumers share it (a queue group): its members and what they hold. */
  queue?: QueueGroupStats;
}

/** A channel as `stats()` reports it. */
export interface ChannelStats extends ChannelCounters {
  channel: string;
  firstSeq: number;
  nextSeq: number;
  messages: number;
  bytes: number;
  segments: number;
  subscribers: SubscriberStats[];
  /** How the channel's log stands with its disk (failed fdatasyncs, reseals, damage). */
  disk: LogHealth;
}

/** Snapshot returned by `stats()`. */
export interface MessengerStats {
  name: string;
  channels: ChannelStats[];
  totals: { channels: number; messages: number; bytes: number; subscribers: number } & ChannelCounters;
  /** Cursor writes that failed (each retried at the next flush) and cursors waiting to be written. */
  cursors: { failedWrites: number; pending: number; lastError: string | null };
  latency: { publishToDisk: LatencySummary; publishToHandler: LatencySummary; fsync: LatencySummary };
}

/** Decoder of a registered payload type: returns the typed value or throws. */
export type PayloadDecoder<T = unknown> = (payload: unknown) => T;

const zeroCounters = (): ChannelCounters => ({ published: 0, delivered: 0, acked: 0, redelivered: 0, failed: 0, deadLettered: 0, expired: 0, rejected: 0, superseded: 0 });

/** Durable local pub/sub. Create with `Messenger.open`. */
export class Messenger {
  /** Instance name: origin of local publishes and first entry of routes. */
  readonly name: string;
  private readonly cfg: ResolvedConfig;
  private readonly store: LogStore;
  private readonly cursorStore: CursorStore;
  /** Cursors of volatile subscribers (ephemeral peers): memory only. */
  private readonly volatileHost: DurableSubscriberHost;
  private readonly subs = new Map<string, Subscription>();
  private readonly matchers = new Map<string, Matcher>();
  private readonly decoders = new Map<string, PayloadDecoder | undefined>();
  private readonly counters = new Map<string, ChannelCounters>();
  private readonly host: SubscriptionHost;
  private readonly readerHost: DurableSubscriberHost;
  private readonly readers = new Map<string, DurableSubscriber>();
  private readonly matchCache = new Map<string, ChannelLog[]>();
  private readonly channelWatchers = new Set<{ pattern: string; fn: () => void }>();
  private readonly publishLatency = new Histogram();
  /** Every id this messenger gives a message: one generator, so that they sort in publish order. */
  private readonly ids = new MessageIds();
  private readonly handlerLatency = new Histogram();
  private readonly fsyncLatency: Histogram;
  private retentionTimer: ReturnType<typeof setInterval> | null = null;
  private state: "open" | "closing" | "closed" = "open";
  private policies: ChannelPolicies;
  /** Requests waiting for their reply. */
  private readonly inboxes = new Inboxes();
  /** Subscribers whose messages several consumers share, while they have members. */
  readonly queues: QueueGroups;
  private readonly queueSubs = new Set<QueueSubscription>();
  private readonly importIndex = new ImportIndex();
  /** Patterns with a consumer attached now (streams, MQTT, forwarders), with how many. */
  private readonly watching = new Map<string, number>();
  /**
   * Where a reply goes whose inbox no request here waits on: federation,
   * which sends it back towards the instance that asked. Returns whether it
   * took the reply.
   */
  foreignReply: ((inbox: string, reply: Message, body: Uint8Array) => boolean) | undefined;
  /**
   * Why a request on a channel nobody here is attached to cannot go on
   * (federation: a link that would carry it is down), or undefined.
   */
  routeDown: ((channel: string) => string | undefined) | undefined;
  /** Channels whose log is being cut back to their bound now. */
  private readonly trimming = new Set<string>();
  private closing: Promise<void> | null = null;

  private constructor(cfg: ResolvedConfig, store: LogStore, cursors: CursorStore, fsyncLatency: Histogram) {
    this.cfg = cfg;
    this.name = cfg.name;
    this.policies = new ChannelPolicies(cfg.channels);
    this.queues = new QueueGroups((err) => cfg.logger.error("queue group failed", { error: String(err) }));
    this.store = store;
    this.cursorStore = cursors;
    this.fsyncLatency = fsyncLatency;
    this.host = {
      cursors,
      logger: cfg.logger,
      retryBackoffBaseMs: cfg.retryBackoffBaseMs,
      retryBackoffMaxMs: cfg.retryBackoffMaxMs,
      decoderFor: (type) => this.decoders.get(type),
      deadLetter: (msg, error, attempts) => this.deadLetter(msg, error, attempts),
      noteDelivered: (channel, ms, redelivery) => {
        const c = this.countersOf(channel);
        c.delivered++;
        c.acked++;
        if (redelivery) c.redelivered++;
        if (ms !== undefined) this.handlerLatency.record(ms);
      },
      noteFailed: (channel) => this.countersOf(channel).failed++,
      noteExpired: (channel) => this.countersOf(channel).expired++,
    };
    this.readerHost = this.readerHostFor(cursors);
    this.volatileHost = this.readerHostFor(CursorStore.memory(cfg.logger));
    store.onChannelCreated((log) => {
      this.matchCache.clear();
      for (const sub of this.subs.values()) if (this.matcher(sub.pattern)(log.name)) sub.attach(log);
      for (const w of [...this.channelWatchers]) if (this.matcher(w.pattern)(log.name)) w.fn();
    });
    if (cfg.retention.maxAgeMs !== undefined || cfg.retention.maxBytes !== undefined || cfg.channels.some((c) => c.maxBytes !== undefined)) {
      this.retentionTimer = setInterval(
        () => void this.runRetention().catch((err) => cfg.logger.error("retention pass failed (tried again at the next check)", { error: String(err) })),
        cfg.retentionCheckMs,
      );
      this.retentionTimer.unref?.();
    }
  }

  private readerHostFor(cursors: CursorStore): DurableSubscriberHost {
    return {
      cursors,
      logger: this.cfg.logger,
      matchingLogs: (pattern) => this.matchingLogs(pattern),
      log: (channel) => this.store.get(channel),
      onMatchingChannel: (pattern, fn) => {
        const w = { pattern, fn };
        this.channelWatchers.add(w);
        return () => this.channelWatchers.delete(w);
      },
      noteSent: (channel, count, redelivered) => {
        const c = this.countersOf(channel);
        c.delivered += count;
        c.redelivered += redelivered;
      },
      noteAcked: (channel, count) => {
        this.countersOf(channel).acked += count;
      },
      noteExpired: (channel, count) => {
        this.countersOf(channel).expired += count;
      },
      noteWatching: (pattern, delta) => {
        const n = (this.watching.get(pattern) ?? 0) + delta;
        if (n > 0) this.watching.set(pattern, n);
        else this.watching.delete(pattern);
      },
    };
  }

  /**
   * Opens the data directory (taking its lock, recovering every channel's
   * log) and returns a ready messenger. Throws `LockedError` when another
   * process holds the directory.
   */
  static async open(config: MessengerConfig): Promise<Messenger> {
    const cfg = resolveConfig(config);
    const fsyncLatency = new Histogram();
    const policies = new ChannelPolicies(cfg.channels);
    const store = await LogStore.open(cfg.dataDir, {
      segmentBytesFor: policies.empty ? undefined : (channel) => policies.segmentBytes(channel, cfg.segmentBytes),
      segmentBytes: cfg.segmentBytes,
      sync: cfg.sync,
      syncIntervalMs: cfg.syncIntervalMs,
      tailCacheBytes: cfg.tailCacheBytes,
      logger: cfg.logger,
      onFsync: (ms) => fsyncLatency.record(ms),
    });
    let cursors: CursorStore;
    try {
      cursors = await CursorStore.open(join(cfg.dataDir, "subscribers"), cfg.logger, cfg.cursorFlushMs);
    } catch (err) {
      await store.close();
      throw err;
    }
    cfg.logger.info("messenger open", { name: cfg.name, data_dir: cfg.dataDir, channels: store.all().length, sync: cfg.sync });
    return new Messenger(cfg, store, cursors, fsyncLatency);
  }

  /**
   * Publishes one message; resolves after the durable write with its id and
   * seq. Service name and correlation id come from `opts`, else from the
   * current `withContext`, else the messenger's default service name.
   */
  async publish(channel: string, type: string, payload: unknown, opts?: PublishOptions): Promise<PublishResult> {
    if (isInbox(channel)) return this.deliverReply(channel, type, payload, opts);
    const ts = Date.now();
    const id = this.ids.next(ts);
    const body = this.encodeBody(channel, type, payload, opts, id, ts);
    const t0 = performance.now();
    const open = this.logFor(channel);
    // (An open channel's log is at hand: no extra turn through a resolved promise.)
    const log = open instanceof Promise ? await open : open;
    if (!this.policies.empty) await this.roomFor(log, body.length);
    const seq = await log.append(body);
    if (!this.policies.empty) this.trimIfOver(log);
    return this.published(channel, id, seq, ts, t0);
  }

  /**
   * `publish` for a caller that knows nothing else is published in this
   * turn (an MQTT publish alone in its read): when the channel's log is
   * open and nothing waits ahead of it, the message is written before this
   * returns, and its seq comes back as it is rather than as a promise
   * (no microtask, no turn of the event loop: at a board's rate, one
   * message a wake-up, those were a visible part of its cost). Otherwise a
   * promise of the seq. Unlike `publish`, a message that cannot be built
   * (bad label, too large) throws here rather than rejecting. The caller
   * gets no id: none is made as a string (nor any result object).
   */
  publishNow(channel: string, type: string, payload: unknown, opts?: PublishOptions): number | Promise<number> {
    if (!this.policies.empty || isInbox(channel)) return this.seqOf(this.publish(channel, type, payload, opts));
    const log = this.logFor(channel);
    if (log instanceof Promise) return this.seqOf(this.publish(channel, type, payload, opts));
    // The id is written into the body: its caller reads only the seq.
    const body = this.encodeBody(channel, type, payload, opts, this.ids, Date.now());
    const t0 = performance.now();
    const seq = log.appendNow(body);
    if (typeof seq !== "number") return this.storedLater(seq, channel, t0);
    return this.stored(channel, seq, t0);
  }

  /**
   * `publish` for a caller that publishes many messages in one turn and is
   * told of each through `waiter` (an MQTT client's window): the message is
   * queued for the next group commit, and `waiter.publishSettled` is called
   * once it is durable or refused, with no promise, callback or result per
   * message. A message that cannot be built into an open channel's log is
   * refused before this returns. Channels with policies, inboxes and
   * channels whose log is not open yet take `publish`'s way, with the same
   * outcome.
   */
  publishTo(channel: string, type: string, payload: unknown, opts: PublishOptions | undefined, waiter: PublishWaiter): void {
    // Only an open log: a channel not yet created is checked and created the long way.
    const log = this.policies.empty && !isInbox(channel) ? this.store.get(channel) : undefined;
    if (log === undefined) return this.publishThen(channel, type, payload, opts, waiter);
    let body: Uint8Array;
    try {
      body = this.encodeBody(channel, type, payload, opts, this.ids, Date.now());
    } catch (err) {
      return waiter.publishSettled(err);
    }
    log.enqueue(new QueuedPublish(body, performance.now(), this.countersOf(channel), this.publishLatency, waiter));
  }

  private publishThen(channel: string, type: string, payload: unknown, opts: PublishOptions | undefined, waiter: PublishWaiter): void {
    this.publish(channel, type, payload, opts).then(
      () => waiter.publishSettled(undefined),
      (err: unknown) => waiter.publishSettled(err),
    );
  }

  // The callbacks of a write that did not settle at once live in functions of their own: a
  // function that makes a closure anywhere in it allocates its scope on every call, until the
  // JIT has optimized it, and these run for every message.
  private storedLater(seq: Promise<number>, channel: string, t0: number): Promise<number> {
    return seq.then((s) => this.stored(channel, s, t0));
  }

  private seqOf(r: Promise<PublishResult>): Promise<number> {
    return r.then(seqOfResult);
  }

  /** Counts a stored publish and gives its seq. */
  private stored(channel: string, seq: number, t0: number): number {
    this.publishLatency.record(performance.now() - t0);
    this.countersOf(channel).published++;
    return seq;
  }

  /** Counts a stored publish and gives its result. */
  private published(channel: string, id: string, seq: number, ts: number, t0: number): PublishResult {
    this.stored(channel, seq, t0);
    return { id, seq, channel, ts };
  }

  /**
   * Publishes several messages in one group commit per channel. Every entry
   * is validated before anything is written; results are in entry order.
   */
  async publishBatch(entries: readonly BatchEntry[]): Promise<PublishResult[]> {
    for (const e of entries) if (isInbox(e.channel)) throw new InvalidArgumentError(`a reply (to ${e.channel}) is sent on its own, not in a batch`);
    const encoded = entries.map((e) => this.encode(e.channel, e.type, e.payload, e.opts));
    const t0 = performance.now();
    // Each channel's entries, in entry order: one group commit and one promise per channel.
    const byChannel = new Map<string, number[]>();
    for (let i = 0; i < entries.length; i++) {
      const at = byChannel.get(entries[i]!.channel);
      if (at) at.push(i);
      else byChannel.set(entries[i]!.channel, [i]);
    }
    const opened = [...byChannel.keys()].map((c) => this.logFor(c));
    const logs = opened.some((o) => o instanceof Promise) ? await Promise.all(opened) : (opened as ChannelLog[]);
    const groups = [...byChannel.values()].map((at, k) => ({ log: logs[k]!, at }));
    if (!this.policies.empty) {
      // A batch is stored whole or not at all: room for every entry of a channel is made, or refused, first.
      for (const g of groups)
        await this.roomFor(
          g.log,
          g.at.reduce((n, i) => n + encoded[i]!.body.length, 0),
        );
    }
    const stored = await Promise.all(groups.map((g) => g.log.appendMany(g.at.map((i) => encoded[i]!.body))));
    const seqs = new Array<number>(entries.length);
    for (let k = 0; k < groups.length; k++) {
      const { at } = groups[k]!;
      for (let j = 0; j < at.length; j++) seqs[at[j]!] = stored[k]![j]!;
    }
    if (!this.policies.empty) for (const g of groups) this.trimIfOver(g.log);
    const dt = performance.now() - t0;
    return encoded.map((e, i) => {
      this.publishLatency.record(dt);
      this.countersOf(entries[i]!.channel).published++;
      return { id: e.id, seq: seqs[i]!, channel: entries[i]!.channel, ts: e.ts };
    });
  }

  /**
   * Stores envelopes that arrived from another instance (federation): their
   * id, origin and route as given (the caller has appended this instance),
   * in one group commit. Resolves with their seqs once durable.
   */
  async ingest(channel: string, bodies: readonly Uint8Array[]): Promise<number[]> {
    if (this.state !== "open") throw new ClosedError();
    assertChannel(channel);
    if (isInbox(channel)) throw new InvalidArgumentError(`${channel} is an inbox: replies are not stored`);
    for (const b of bodies) {
      if (b.length > this.cfg.maxMessageBytes) throw new TooLargeError(`forwarded message of ${b.length} bytes exceeds the limit of ${this.cfg.maxMessageBytes}`);
    }
    // An open log is taken as it is, so that the records are queued before this returns: an
    // `ingestNow` right behind must find them ahead of its own (no turn through a resolved promise).
    const open = this.logFor(channel);
    const log = open instanceof Promise ? await open : open;
    if (!this.policies.empty)
      await this.roomFor(
        log,
        bodies.reduce((n, b) => n + b.length, 0),
      );
    const seqs = await log.appendMany(bodies);
    this.countersOf(channel).published += bodies.length;
    if (!this.policies.empty) this.trimIfOver(log);
    return seqs;
  }

  /**
   * `ingest` of one record for a receiver that knows nothing else is stored
   * in this turn (a batch of one record, alone in its read: a steady link's
   * usual), as `publishNow` is to `publish`: when the channel's log is open
   * and nothing waits ahead of it, the record is written before this
   * returns, and its seq comes back as it is. Otherwise a promise, as from
   * `ingest`; this never throws.
   */
  ingestNow(channel: string, body: Uint8Array): number | Promise<number> {
    if (this.state !== "open" || !this.policies.empty || isInbox(channel) || body.length > this.cfg.maxMessageBytes) return this.ingestOne(channel, body);
    // A log that is open already was opened under a checked name; a new one goes the long way.
    const log = this.store.get(channel);
    if (log === undefined) return this.ingestOne(channel, body);
    const seq = log.appendNow(body);
    if (typeof seq !== "number") return this.ingestedLater(seq, channel);
    this.countersOf(channel).published++;
    return seq;
  }

  private async ingestOne(channel: string, body: Uint8Array): Promise<number> {
    return (await this.ingest(channel, [body]))[0]!;
  }

  private ingestedLater(seq: Promise<number>, channel: string): Promise<number> {
    return seq.then((s) => {
      this.countersOf(channel).published++;
      return s;
    });
  }

  /**
   * Stores messages exported from a log (`keyop import`) with their ids,
   * times, origins and routes as they were (this instance added to the
   * route). One whose id its channel holds already, or that comes twice,
   * is a duplicate and dropped. Channel by channel: when one fails, those
   * before it are stored, and importing again drops them as duplicates.
   */
  async importEnvelopes(fields: readonly EnvelopeFields[]): Promise<{ imported: number; duplicates: number }> {
    if (this.state !== "open") throw new ClosedError();
    const byChannel = new Map<string, EnvelopeFields[]>();
    for (const f of fields) {
      assertChannel(f.channel);
      if (isInbox(f.channel)) throw new InvalidArgumentError(`${f.channel} is an inbox: replies are not stored`);
      assertLabel(f.type, "type");
      let list = byChannel.get(f.channel);
      if (!list) {
        list = [];
        byChannel.set(f.channel, list);
      }
      list.push(f);
    }
    let imported = 0;
    let duplicates = 0;
    for (const [channel, list] of byChannel) {
      const log = await this.logFor(channel);
      const ids = await this.importIndex.idsOf(log);
      const bodies: Uint8Array[] = [];
      const added: string[] = [];
      for (const f of list) {
        if (ids.has(f.id)) {
          duplicates++;
          continue;
        }
        ids.add(f.id);
        added.push(f.id);
        const route = f.route[f.route.length - 1] === this.name ? f.route : [...f.route, this.name];
        bodies.push(encodeEnvelope({ ...f, route }));
      }
      if (bodies.length === 0) continue;
      try {
        await this.ingest(channel, bodies);
      } catch (err) {
        for (const id of added) ids.delete(id);
        throw err;
      }
      imported += bodies.length;
    }
    return { imported, duplicates };
  }

  /**
   * Publishes a request on `channel` and resolves with its reply. The
   * request carries `reply_to` (an inbox) and expires with the wait; whoever
   * gets it (a handler, a stream, an MQTT client, a board over a link)
   * answers with `reply`. Rejects with `NoRespondersError` at once when
   * nobody is attached to the channel (unless `durable`), and with
   * `RequestTimeoutError` when no reply came in time.
   */
  async request(channel: string, type: string, payload: unknown, opts: RequestOptions = {}): Promise<Message> {
    if (this.state !== "open") throw new ClosedError();
    const timeoutMs = opts.timeoutMs ?? 5000;
    if (!(Number.isSafeInteger(timeoutMs) && timeoutMs > 0)) throw new InvalidArgumentError("timeoutMs must be a positive integer");
    assertChannel(channel);
    if (isInbox(channel)) throw new InvalidArgumentError("a request cannot be sent to an inbox");
    if (!opts.durable && !this.hasConsumers(channel)) {
      const down = this.routeDown?.(channel);
      if (down) throw new RouteDownError(`a request on ${channel} cannot reach its responders: ${down}`);
      throw new NoRespondersError(`nobody is attached to answer a request on ${channel}`);
    }
    const inbox = newInbox();
    const reply = this.inboxes.wait(inbox, timeoutMs, channel);
    // It may be ended (a close, a timeout) while the publish below is still awaited, before the
    // caller holds it: handled here, it still rejects for the caller.
    reply.catch(() => {});
    const { timeoutMs: _t, durable: _d, ...publish } = opts;
    try {
      await this.publish(channel, type, payload, { ...publish, meta: { ...opts.meta, replyTo: inbox, expires: opts.meta?.expires ?? Date.now() + timeoutMs } });
    } catch (err) {
      this.inboxes.fail(inbox, err);
    }
    return reply;
  }

  /**
   * Answers `request` (a message that carries `reply_to`): the reply goes
   * to the one request waiting on that inbox, here or, through federation,
   * on the instance that asked; it is never stored. Throws
   * `NoRequestError` when no request waits on it any more.
   */
  reply(request: Message, type: string, payload: unknown, opts: PublishOptions = {}): Promise<PublishResult> {
    if (!request.replyTo) throw new InvalidArgumentError(`message ${request.id} carries no reply_to: it is not a request`);
    // An MQTT 5 requester tells its replies apart by the correlation data it sent: echoed.
    const meta = request.correlationData && !opts.meta?.correlationData ? { ...opts.meta, correlationData: request.correlationData } : opts.meta;
    return this.publish(request.replyTo, type, payload, { ...opts, correlationId: request.id, ...(meta ? { meta } : {}) });
  }

  /**
   * Answers requests on `pattern` with what `handler` returns (of type
   * `opts.type`, default "reply"); messages that are not requests are
   * handed to it too, its result ignored. A durable subscriber (`opts.name`,
   * default "responder"), so requests stored while it was away are answered
   * once it is back, if they have not expired.
   */
  respond<T = unknown>(pattern: string, handler: (msg: Message<T>) => unknown, opts: { name?: string; type?: string } = {}): Promise<Subscription> {
    return this.subscribe<T>(
      pattern,
      opts.name ?? "responder",
      async (msg) => {
        const out = await handler(msg);
        if (!msg.replyTo || out === undefined) return;
        await this.reply(msg, opts.type ?? "reply", out).catch((err) => {
          // The requester gave up (timed out) or is gone: nothing to retry.
          if (err instanceof KeyopError && err.code === "no_request") return;
          throw err;
        });
      },
      { from: "latest" },
    );
  }

  /** Whether anyone is attached to get a message on `channel` now: a handler, or a reader (stream, MQTT client, link). */
  hasConsumers(channel: string): boolean {
    for (const sub of this.subs.values()) if (this.matcher(sub.pattern)(channel)) return true;
    for (const pattern of this.watching.keys()) if (this.matcher(pattern)(channel)) return true;
    return false;
  }

  /**
   * A reply that came over a link for `inbox`: handed to the request that
   * waits here. False when none waits (the caller may send it on), or when
   * the bytes are not a reply to that inbox.
   */
  deliverForeignReply(inbox: string, body: Uint8Array): boolean {
    let msg: Message;
    try {
      msg = decodeEnvelope(body, 0);
    } catch {
      return false;
    }
    if (msg.channel !== inbox) return false;
    return this.inboxes.waits(inbox) && this.inboxes.deliver(inbox, msg);
  }

  private async deliverReply(inbox: string, type: string, payload: unknown, opts?: PublishOptions): Promise<PublishResult> {
    const { body, id, ts } = this.encode(inbox, type, payload, opts);
    const msg = decodeEnvelope(body, 0);
    const here = this.inboxes.waits(inbox) && this.inboxes.deliver(inbox, msg);
    if (!here && !this.foreignReply?.(inbox, msg, body)) {
      this.inboxes.dropped++;
      throw new NoRequestError(`no request waits on ${inbox} (it timed out, or was answered)`);
    }
    return { id, seq: 0, channel: inbox, ts };
  }

  /** The `channels` entry that applies to `channel` (TTL, bound, full policy). */
  channelPolicy(channel: string): AppliedPolicy {
    return this.policies.of(channel);
  }

  /** Counts messages of `channel` that a link passed over for a newer one (`latest`). */
  noteSuperseded(channel: string, count: number): void {
    this.countersOf(channel).superseded += count;
  }

  /**
   * Makes room for `bytes` more in a `reject` channel: lets go of segments
   * every subscriber and link has acknowledged, and refuses the publish
   * (`BufferFullError`) when that is not enough. Other channels: nothing.
   */
  private async roomFor(log: ChannelLog, bytes: number): Promise<void> {
    const p = this.policies.of(log.name);
    if (p.maxBytes === undefined || p.fullPolicy !== "reject" || log.bytes + bytes <= p.maxBytes) return;
    await this.retain(log, { maxBytes: Math.max(0, p.maxBytes - bytes), pinnedSeq: this.pinnedSeq(log), keepPinned: true });
    if (log.bytes + bytes > p.maxBytes) {
      this.countersOf(log.name).rejected++;
      throw new BufferFullError(`channel ${log.name} is full: ${log.bytes} of its ${p.maxBytes} bytes are not yet acknowledged by every subscriber and link (policy reject)`);
    }
  }

  /** A channel over its bound (drop_oldest, latest) is cut back in the background, one pass at a time. */
  private trimIfOver(log: ChannelLog): void {
    const p = this.policies.of(log.name);
    if (p.maxBytes === undefined || p.fullPolicy === "reject" || log.bytes <= p.maxBytes || this.trimming.has(log.name)) return;
    this.trimming.add(log.name);
    void this.retain(log, { maxBytes: p.maxBytes, pinnedSeq: this.pinnedSeq(log) })
      .catch((err) => this.cfg.logger.error("could not cut a channel back to its bound (tried again at its next publish)", { channel: log.name, error: String(err) }))
      .finally(() => this.trimming.delete(log.name));
  }

  /** Lowest seq any durable subscriber (a link's included) of `log` still needs. */
  private pinnedSeq(log: ChannelLog): number {
    let pinned = Infinity;
    for (const s of this.cursorStore.list()) {
      if (!this.matcher(s.pattern)(log.name)) continue;
      pinned = Math.min(pinned, s.cursors[log.name] ?? log.firstSeq);
    }
    return pinned;
  }

  private encode(channel: string, type: string, payload: unknown, opts?: PublishOptions): BuiltEnvelope {
    const ts = Date.now();
    const id = this.ids.next(ts);
    return { body: this.encodeBody(channel, type, payload, opts, id, ts), id, ts };
  }

  /** The stored body of a new message with `id` and `ts`: checked, labelled, with its TTL. */
  private encodeBody(channel: string, type: string, payload: unknown, opts: PublishOptions | undefined, id: string | MessageIds, ts: number): Uint8Array {
    if (this.state !== "open") throw new ClosedError();
    const ttl = opts?.ttlMs ?? (this.policies.empty ? undefined : this.policies.of(channel).ttlMs);
    let meta = opts?.meta;
    if (ttl !== undefined && meta?.expires === undefined) {
      if (!(Number.isSafeInteger(ttl) && ttl > 0)) throw new InvalidArgumentError("ttl must be a positive integer of milliseconds");
      meta = { ...meta, expires: Date.now() + ttl };
    }
    const ctx = currentContext();
    const correlationId = correlationIdOf(opts, ctx);
    const serviceName = serviceNameOf(opts, ctx, this.cfg.serviceName);
    assertPublishable(channel);
    return buildBody(this.name, id, ts, channel, type, payload, correlationId, serviceName, meta, this.cfg.maxMessageBytes);
  }

  private logFor(channel: string): ChannelLog | Promise<ChannelLog> {
    return this.store.getOrCreate(channel);
  }

  private async deadLetter(msg: Message, error: unknown, attempts: number): Promise<void> {
    if (isDeadLetter(msg.channel)) {
      // A dead letter that fails again is not dead-lettered twice: log it and move on.
      this.cfg.logger.error("dead letter handler failed, message dropped", { channel: msg.channel, seq: msg.seq, id: msg.id, attempts });
      return;
    }
    const channel = deadLetterOf(msg.channel);
    const payload = {
      error: error instanceof Error ? error.message : String(error),
      code: error instanceof KeyopError ? error.code : undefined,
      attempts,
      failed_at: Date.now(),
      message: toWire(msg),
    };
    const m = labelledMessage(channel, "keyop.dead-letter", payload, { correlationId: msg.correlationId ?? msg.id }, this.cfg.serviceName);
    const { body } = buildOnCheckedChannel(this.name, m, this.cfg.maxMessageBytes, this.ids);
    const log = await this.logFor(channel);
    await log.append(body);
    this.countersOf(msg.channel).deadLettered++;
    this.cfg.logger.warn("message dead-lettered", { channel: msg.channel, seq: msg.seq, id: msg.id, attempts, dead_letter: channel });
  }

  /**
   * Starts a durable subscription: `handler` gets every message of the
   * matching channels after the subscriber's cursor, in order per channel
   * (different channels of a pattern are delivered concurrently). A new
   * subscriber starts at `opts.from` (default latest); an existing one
   * resumes where it acked.
   */
  async subscribe<T = unknown>(pattern: string, name: string, handler: Handler<T>, opts: SubscribeOptions = {}): Promise<Subscription> {
    if (this.state !== "open") throw new ClosedError();
    assertPattern(pattern);
    assertName(name);
    if (typeof handler !== "function") throw new InvalidArgumentError("handler must be a function");
    const from = opts.from ?? "latest";
    if (!(from === "latest" || from === "earliest" || (Number.isInteger(from) && (from as number) >= 1))) {
      throw new InvalidArgumentError(`from must be "earliest", "latest" or a seq >= 1`);
    }
    const key = cursorKey(pattern, name);
    if (this.subs.has(key)) throw new InvalidArgumentError(`subscriber ${name} on ${pattern} is already running`);
    if (this.queues.get(pattern, name)) throw new ConflictError(`subscriber ${name} on ${pattern} is shared by a queue group: join it with subscribeQueue`);
    const state = this.cursorStore.get(pattern, name) ?? this.createSubscriber(pattern, name, from);
    const maxRetries = opts.maxRetries ?? this.cfg.maxRetries;
    const serviceName = opts.serviceName ?? currentContext()?.serviceName ?? this.cfg.serviceName;
    const sub = new Subscription(this.host, state, handler as Handler<unknown>, serviceName, maxRetries);
    this.subs.set(key, sub);
    for (const log of this.matchingLogs(pattern)) sub.attach(log);
    return sub;
  }

  /**
   * Joins the queue group of a durable subscriber with `opts.concurrency`
   * workers calling `handler` (default 1): each message goes to one member
   * of the group, whether in this process or another (HTTP streams,
   * WebSockets, MQTT shared subscriptions on the same subscriber). Order
   * within a channel is given up, except per `opts.key`. A message is acked
   * when its handler call returns (or it is dead-lettered); the cursor
   * moves past every acked prefix.
   */
  async subscribeQueue<T = unknown>(pattern: string, name: string, handler: Handler<T>, opts: QueueSubscribeOptions = {}): Promise<QueueSubscription> {
    if (this.state !== "open") throw new ClosedError();
    if (typeof handler !== "function") throw new InvalidArgumentError("handler must be a function");
    const concurrency = opts.concurrency ?? 1;
    if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 1024) throw new InvalidArgumentError("concurrency must be an integer 1..1024");
    if (this.subs.has(cursorKey(pattern, name))) throw new ConflictError(`subscriber ${name} on ${pattern} is running with a handler of its own`);
    const sub = this.openSubscriber(pattern, name, { from: opts.from ?? "latest" });
    const q = new QueueSubscription(
      this.host,
      this.queues,
      sub,
      handler as Handler<unknown>,
      {
        serviceName: opts.serviceName ?? currentContext()?.serviceName ?? this.cfg.serviceName,
        maxRetries: opts.maxRetries ?? this.cfg.maxRetries,
        concurrency,
        key: opts.key,
      },
      (channel) => this.store.get(channel),
    );
    this.queueSubs.add(q);
    return q;
  }

  /** A new durable subscriber positioned per `from` on the channels that exist now. */
  private createSubscriber(pattern: string, name: string, from: StartFrom, store = this.cursorStore): CursorState {
    const state = store.create(pattern, name, from);
    for (const log of this.matchingLogs(pattern)) {
      const start = from === "latest" ? log.nextSeq : from === "earliest" ? log.firstSeq : Math.max(from, log.firstSeq);
      store.set(state, log.name, start);
    }
    // Channels created from now on start at their beginning.
    state.from = typeof from === "number" ? from : "earliest";
    if (store === this.cursorStore) this.cfg.logger.info("subscriber created", { subscriber: name, pattern, from });
    return state;
  }

  /**
   * A handle on a durable subscriber consumed by pull or stream (no
   * handler), created at `from` unless it exists or `create` is false
   * (then `UnknownSubscriberError`).
   */
  openSubscriber(pattern: string, name: string, opts: { from?: StartFrom; create?: boolean; like?: string } = {}): DurableSubscriber {
    if (this.state !== "open") throw new ClosedError();
    assertPattern(pattern);
    assertName(name);
    const key = cursorKey(pattern, name);
    const existing = this.readers.get(key);
    if (existing && this.cursorStore.get(pattern, name)) return existing;
    let state = this.cursorStore.get(pattern, name);
    if (!state) {
      if (opts.create === false) throw new UnknownSubscriberError(`no subscriber "${name}" on ${pattern}`);
      const from = opts.from ?? "latest";
      if (!(from === "latest" || from === "earliest" || (Number.isInteger(from) && (from as number) >= 1))) {
        throw new InvalidArgumentError(`from must be "earliest", "latest" or a seq >= 1`);
      }
      // `like`: start where another subscriber of the pattern stands (a link's cursors taking over from its hold).
      const model = opts.like === undefined ? undefined : this.cursorStore.get(pattern, opts.like);
      state = this.createSubscriber(pattern, name, model ? "earliest" : from);
      if (model) for (const [channel, at] of Object.entries(model.cursors)) this.cursorStore.set(state, channel, at);
    }
    const handle = new DurableSubscriber(this.readerHost, state);
    this.readers.set(key, handle);
    return handle;
  }

  /**
   * A subscriber whose cursors live in this process's memory only, starting
   * at the latest message: nothing is written, it is not listed among the
   * subscribers and it pins nothing in retention. For ephemeral federation
   * peers, which get live messages and no replay. Drop it with
   * `dropVolatileSubscriber` when the peer goes.
   */
  openVolatileSubscriber(pattern: string, name: string): DurableSubscriber {
    if (this.state !== "open") throw new ClosedError();
    assertPattern(pattern);
    assertName(name);
    const store = this.volatileHost.cursors;
    const state = store.get(pattern, name) ?? this.createSubscriber(pattern, name, "latest", store);
    return new DurableSubscriber(this.volatileHost, state);
  }

  /** Forgets a subscriber made by `openVolatileSubscriber`. */
  dropVolatileSubscriber(sub: DurableSubscriber): void {
    void this.volatileHost.cursors.delete(sub.pattern, sub.name);
  }

  /**
   * The subscriber an ack on `channel` by `name` means: the one on exactly
   * that channel, else the single pattern subscriber of that name matching
   * it. Throws `UnknownSubscriberError` when there is none (or several).
   */
  resolveSubscriber(channel: string, name: string): DurableSubscriber {
    if (this.cursorStore.get(channel, name)) return this.openSubscriber(channel, name, { create: false });
    const candidates = this.cursorStore.list().filter((s) => s.name === name && this.matcher(s.pattern)(channel));
    if (candidates.length === 1) return this.openSubscriber(candidates[0]!.pattern, name, { create: false });
    if (candidates.length > 1) {
      throw new UnknownSubscriberError(`subscriber "${name}" is ambiguous on ${channel}: patterns ${candidates.map((c) => c.pattern).join(", ")}; ack on the pattern path`);
    }
    throw new UnknownSubscriberError(`no subscriber "${name}" on ${channel}`);
  }

  /** Every durable subscriber: pattern, name and when it last acked or was touched (epoch ms). */
  subscribers(): { pattern: string; name: string; touched: number }[] {
    return this.cursorStore.list().map((s) => ({ pattern: s.pattern, name: s.name, touched: s.touched }));
  }

  /** The logs of every channel. */
  channelLogs(): ChannelLog[] {
    return this.store.all();
  }

  /** The log of an existing channel (undefined if it does not exist). */
  channelLog(channel: string): ChannelLog | undefined {
    return this.store.get(channel);
  }

  /** Logs of existing channels matching `pattern` (cached until a channel is created). */
  private matchingLogs(pattern: string): ChannelLog[] {
    let logs = this.matchCache.get(pattern);
    if (!logs) {
      const m = this.matcher(pattern);
      logs = this.store.all().filter((l) => m(l.name));
      // Bounded, but above the patterns of a hub with thousands of peers (each reads its own).
      if (this.matchCache.size > 50_000) this.matchCache.clear();
      this.matchCache.set(pattern, logs);
    }
    return logs;
  }

  /**
   * Stops a subscription once its running handler call returns. The durable
   * cursor stays (the subscriber resumes there) unless `deleteCursor` is set.
   */
  async unsubscribe(sub: Subscription | QueueSubscription, opts: { deleteCursor?: boolean } = {}): Promise<void> {
    const key = cursorKey(sub.pattern, sub.name);
    if (this.subs.get(key) === sub) this.subs.delete(key);
    if (sub instanceof QueueSubscription) this.queueSubs.delete(sub);
    await sub.stop();
    if (opts.deleteCursor) {
      this.readers.delete(key);
      await this.cursorStore.delete(sub.pattern, sub.name);
    } else await this.cursorStore.flush();
  }

  /** Removes a durable subscriber (stopping it if running); false if unknown. */
  async deleteSubscriber(pattern: string, name: string): Promise<boolean> {
    this.readers.delete(cursorKey(pattern, name));
    const sub = this.subs.get(cursorKey(pattern, name));
    if (sub) {
      this.subs.delete(cursorKey(pattern, name));
      await sub.stop();
    }
    return this.cursorStore.delete(pattern, name);
  }

  /**
   * Registers a payload type. With `decode`, handlers get the decoded value,
   * and a payload the decoder rejects goes straight to the dead-letter channel.
   */
  registerPayloadType<T>(type: string, decode?: PayloadDecoder<T>): void {
    assertLabel(type, "type");
    if (decode !== undefined && typeof decode !== "function") throw new InvalidArgumentError("decode must be a function");
    this.decoders.set(type, decode);
  }

  /** Payload types registered so far. */
  get payloadTypes(): string[] {
    return [...this.decoders.keys()];
  }

  /**
   * New retention limits and channel policies (a configuration reload):
   * TTLs, bounds and full policies apply from the next publish, retention
   * from its next pass (started now when there was none before).
   */
  reconfigure(next: { retention: { maxAgeMs?: number | undefined; maxBytes?: number | undefined }; channels: ChannelPolicy[] }): void {
    this.cfg.retention = { maxAgeMs: next.retention.maxAgeMs, maxBytes: next.retention.maxBytes };
    this.cfg.channels = next.channels;
    this.policies = new ChannelPolicies(next.channels);
    const wanted = this.cfg.retention.maxAgeMs !== undefined || this.cfg.retention.maxBytes !== undefined || next.channels.some((c) => c.maxBytes !== undefined);
    if (wanted && !this.retentionTimer && this.state === "open") {
      this.retentionTimer = setInterval(
        () => void this.runRetention().catch((err) => this.cfg.logger.error("retention pass failed (tried again at the next check)", { error: String(err) })),
        this.cfg.retentionCheckMs,
      );
      this.retentionTimer.unref?.();
    }
    if (!wanted && this.retentionTimer) {
      clearInterval(this.retentionTimer);
      this.retentionTimer = null;
    }
  }

  /** Runs a retention pass over every channel now (the timer also does). */
  async runRetention(): Promise<void> {
    const { maxAgeMs, maxBytes: storeMax } = this.cfg.retention;
    for (const log of this.store.all()) {
      const p = this.policies.of(log.name);
      // A channel's own bound replaces the store's; a reject channel keeps what is not acknowledged.
      const maxBytes = p.maxBytes ?? storeMax;
      if (maxAgeMs === undefined && maxBytes === undefined) continue;
      await this.retain(log, { maxAgeMs, maxBytes, pinnedSeq: this.pinnedSeq(log), keepPinned: p.maxBytes !== undefined && p.fullPolicy === "reject" });
    }
  }

  /** One retention pass over `log`, logged. */
  private async retain(log: ChannelLog, policy: RetentionPolicy): Promise<void> {
    const r = await log.applyRetention(policy);
    if (r.removedSegments === 0) return;
    const behind = this.cursorStore.list().filter((s) => (s.cursors[log.name] ?? Infinity) < r.firstSeq);
    const fields = {
      channel: log.name,
      segments: r.removedSegments,
      records: r.removedRecords,
      bytes: r.removedBytes,
      first_seq: r.firstSeq,
      subscribers_behind: behind.map((s) => s.name),
    };
    if (behind.length > 0) this.cfg.logger.warn("retention removed messages not yet read", fields);
    else this.cfg.logger.info("retention removed segments", fields);
  }

  /** Messages stored since start, over every channel (cheap: no per-subscriber figures). */
  publishedTotal(): number {
    let n = 0;
    for (const c of this.counters.values()) n += c.published;
    return n;
  }

  /** Per-channel and total figures, subscriber lag, latency percentiles. */
  stats(): MessengerStats {
    const subs = this.cursorStore.list();
    const totals = { channels: 0, messages: 0, bytes: 0, subscribers: subs.length, ...zeroCounters() };
    const channels: ChannelStats[] = [];
    // Each subscriber to the channels its pattern matches (cached): a hub with thousands of peer
    // cursors over hundreds of channels must not test every pair.
    const byChannel = new Map<string, typeof subs>();
    for (const s of subs) {
      for (const log of this.matchingLogs(s.pattern)) {
        let list = byChannel.get(log.name);
        if (!list) {
          list = [];
          byChannel.set(log.name, list);
        }
        list.push(s);
      }
    }
    for (const log of this.store.all().sort((a, b) => a.name.localeCompare(b.name))) {
      const c = this.counters.get(log.name) ?? zeroCounters();
      const subscribers: SubscriberStats[] = [];
      for (const s of byChannel.get(log.name) ?? []) {
        const cursor = Math.max(s.cursors[log.name] ?? log.firstSeq, log.firstSeq);
        const group = this.queues.get(s.pattern, s.name);
        subscribers.push({
          name: s.name,
          pattern: s.pattern,
          cursor,
          lag: Math.max(0, log.nextSeq - cursor),
          skipped: s.skipped[log.name] ?? 0,
          active: this.subs.has(cursorKey(s.pattern, s.name)) || group !== undefined,
          ...(group ? { queue: group.stats() } : {}),
        });
      }
      const st: ChannelStats = {
        channel: log.name,
        firstSeq: log.firstSeq,
        nextSeq: log.nextSeq,
        messages: log.nextSeq - log.firstSeq,
        bytes: log.bytes,
        segments: log.segmentCount,
        subscribers,
        disk: log.health(),
        ...c,
      };
      channels.push(st);
      totals.channels++;
      totals.messages += st.messages;
      totals.bytes += st.bytes;
      for (const k of Object.keys(c) as (keyof ChannelCounters)[]) totals[k] += c[k];
    }
    return {
      name: this.name,
      channels,
      totals,
      cursors: this.cursorStore.health(),
      latency: {
        publishToDisk: this.publishLatency.summary(),
        publishToHandler: this.handlerLatency.summary(),
        fsync: this.fsyncLatency.summary(),
      },
    };
  }

  /** The latency histograms behind `stats().latency`, for metric exposition. */
  histograms(): { publishToDisk: Histogram; publishToHandler: Histogram; fsync: Histogram } {
    return { publishToDisk: this.publishLatency, publishToHandler: this.handlerLatency, fsync: this.fsyncLatency };
  }

  /** The resolved configuration (read-only use). */
  get config(): Readonly<ResolvedConfig> {
    return this.cfg;
  }

  /**
   * Stops subscriptions (waiting for running handler calls), stops intake,
   * drains queued appends, flushes cursors and releases the data directory.
   */
  close(): Promise<void> {
    this.closing ??= this.doClose();
    return this.closing;
  }

  private async doClose(): Promise<void> {
    if (this.retentionTimer) clearInterval(this.retentionTimer);
    this.inboxes.failAll(new ClosedError());
    const subs = [...this.subs.values(), ...this.queueSubs];
    this.subs.clear();
    this.queueSubs.clear();
    await Promise.all(subs.map((s) => s.stop()));
    this.queues.stopAll();
    this.state = "closing";
    await this.store.close();
    await this.cursorStore.close();
    this.state = "closed";
    this.cfg.logger.info("messenger closed", { name: this.name });
  }

  private matcher(pattern: string): Matcher {
    let m = this.matchers.get(pattern);
    if (!m) {
      m = compilePattern(pattern);
      this.matchers.set(pattern, m);
    }
    return m;
  }

  private countersOf(channel: string): ChannelCounters {
    let c = this.counters.get(channel);
    if (!c) {
      c = zeroCounters();
      this.counters.set(channel, c);
    }
    return c;
  }
}

export type { StartFrom };

const seqOfResult = (r: PublishResult): number => r.seq;
