/**
 * EphemeralMessenger: a program that talks straight to a hub over the
 * federation protocol, with no log of its own (README, "The library").
 *
 * Publishing is durable at the hub: `publish` resolves only once the hub has
 * stored the message (its ACK after the group commit). Concurrent publishes
 * share BATCH frames. If the connection drops before the ACK, the publish
 * rejects with `ConnectionLostError` (`conn_lost`): the hub may or may not
 * have stored it. Subscribing is live only: the hub keeps no cursor for an
 * ephemeral peer, so nothing is replayed after a reconnect and nothing is
 * pinned in the hub's retention; the client's own publishes are not echoed.
 */
import { decodeEnvelope, type Message } from "../envelope/envelope.ts";
import { assertPattern, compilePattern, compileRules, type Matcher } from "../envelope/names.ts";
import { AbortedError, ClosedError, ConnectionLostError, ForbiddenError, InvalidArgumentError, type KeyopError, NotConnectedError, PeerRejectedError } from "../errors.ts";
import { labelledMessage } from "../messenger/context.ts";
import { createLogger, type Logger } from "../observability/logger.ts";
import { connectMtls } from "../pki/mtls.ts";
import { loadTlsMaterial, type TlsFiles, type TlsMaterial } from "../pki/tls.ts";
import { type AttemptControl, Redialer, splitHostPort } from "./redial.ts";
import { buildEnvelope } from "../envelope/build.ts";
import { MessageIds } from "../envelope/message-id.ts";
import { ackFrame, batchFrame, clientHello, type Ack, type Batch } from "./messages.ts";
import { type PeerSession, sessionHandler } from "./session.ts";

/** How an EphemeralMessenger connects and behaves. */
export interface EphemeralConfig {
  /** The hub's `host:port`. */
  hub: string;
  /** PEM files (or loaded material): the certificate's CN is this client's name at the hub. */
  tls: TlsFiles | TlsMaterial;
  /** Channels to receive live (patterns), fixed at connect. */
  subscribe?: string[];
  /** Reconnect after a drop, with the links' backoff (default false). */
  autoReconnect?: boolean;
  /** First reconnect delay (default 500 ms), doubling up to `reconnectMaxMs` (60 s), ± `reconnectJitter` (0.2). */
  reconnectBaseMs?: number;
  reconnectMaxMs?: number;
  reconnectJitter?: number;
  /** Largest BATCH this client sends (default 1 MiB; the hub may lower it). */
  maxBatchBytes?: number;
  /** Publishes waiting to be sent before `publish` waits for room (default 10,000). */
  queueSize?: number;
  /** Batches sent and not yet acknowledged (default 8). */
  window?: number;
  heartbeatMs?: number;
  /** Default service name of publishes. */
  serviceName?: string;
  logger?: Logger;
  /** Called once when the hub refuses this client for good (unknown certificate name, no common version). */
  onFatal?: (err: KeyopError) => void;
}

/** What a publish resolves with once the hub has stored the message. */
export interface EphemeralPublishResult {
  id: string;
  channel: string;
  ts: number;
}

/** Options of one publish. */
export interface EphemeralPublishOptions {
  correlationId?: string;
  serviceName?: string;
  /** Gives up waiting for queue room (the message was not sent). */
  signal?: AbortSignal;
}

/** A live message handler; errors are logged and do not stop delivery. */
export type EphemeralHandler<T = unknown> = (msg: Message<T>) => unknown | Promise<unknown>;

interface Pending {
  channel: string;
  body: Uint8Array;
  id: string;
  ts: number;
  resolve: (r: EphemeralPublishResult) => void;
  reject: (e: unknown) => void;
}

/** CLOSE codes after which retrying cannot help. */
const FATAL_CODES = new Set(["unknown_peer", "peer_rejected", "refused", "version"]);

/** A connection to a hub without local storage. */
export class EphemeralMessenger {
  private readonly cfg: Required<Omit<EphemeralConfig, "tls" | "serviceName" | "onFatal" | "logger">> & Pick<EphemeralConfig, "serviceName" | "onFatal">;
  private readonly logger: Logger;
  private readonly tlsSource: TlsFiles | TlsMaterial;
  private material: TlsMaterial | undefined;
  private session: PeerSession | null = null;
  /** `down`: the connection ended and no reconnect is coming (no autoReconnect, or refused for good). */
  private state: "idle" | "connecting" | "open" | "backoff" | "down" | "closed" = "idle";
  /** Publish patterns the hub allows this client (from WELCOME). */
  private allowed: Matcher | null = null;
  private readonly queue: Pending[] = [];
  private readonly roomWaiters: (() => void)[] = [];
  /** The ids of this client's messages, in publish order. */
  private readonly ids = new MessageIds();
  private readonly inflight = new Map<number, Pending[]>();
  private nextBatch = 1;
  private nextSeq = 1;
  private sendScheduled = false;
  private readonly handlers = new Set<{ match: Matcher; fn: EphemeralHandler }>();
  private delivery: Promise<void> = Promise.resolve();
  private fatal: KeyopError | null = null;
  private loop: Promise<void> | null = null;
  private readonly closing = new AbortController();
  private firstOpen: { resolve: () => void; reject: (e: unknown) => void } | null = null;
  /** Times the connection was (re)established. */
  connects = 0;

  constructor(cfg: EphemeralConfig) {
    if (typeof cfg.hub !== "string" || !/^.+:\d+$/.test(cfg.hub)) throw new InvalidArgumentError(`hub must be host:port, got ${JSON.stringify(cfg.hub)}`);
    for (const p of cfg.subscribe ?? []) assertPattern(p);
    this.tlsSource = cfg.tls;
    this.logger = cfg.logger ?? createLogger({ level: "warn" });
    this.cfg = {
      hub: cfg.hub,
      subscribe: cfg.subscribe ?? [],
      autoReconnect: cfg.autoReconnect ?? false,
      reconnectBaseMs: cfg.reconnectBaseMs ?? 500,
      reconnectMaxMs: cfg.reconnectMaxMs ?? 60_000,
      reconnectJitter: cfg.reconnectJitter ?? 0.2,
      maxBatchBytes: cfg.maxBatchBytes ?? 1024 * 1024,
      queueSize: cfg.queueSize ?? 10_000,
      window: cfg.window ?? 8,
      heartbeatMs: cfg.heartbeatMs ?? 10_000,
      serviceName: cfg.serviceName,
      onFatal: cfg.onFatal,
    };
  }

  /** This client's name at the hub (its certificate's CN); known after `connect`. */
  get name(): string {
    if (!this.material) throw new NotConnectedError("not connected yet");
    return this.material.name;
  }

  /** True while a session with the hub is open. */
  get connected(): boolean {
    return this.state === "open";
  }

  /**
   * Connects and resolves after the first handshake. Without
   * `autoReconnect` one attempt is made; with it, attempts continue (with
   * backoff) until one succeeds, the hub refuses for good, `signal` aborts
   * or `close()` is called. Later drops reconnect in the background.
   */
  async connect(opts: { signal?: AbortSignal } = {}): Promise<void> {
    if (this.state === "closed") throw new ClosedError("ephemeral messenger is closed");
    if (this.loop) throw new InvalidArgumentError("connect() was already called");
    this.material = "certPem" in this.tlsSource ? this.tlsSource : await loadTlsMaterial(this.tlsSource);
    const opened = new Promise<void>((resolve, reject) => (this.firstOpen = { resolve, reject }));
    const onAbort = () => this.firstOpen?.reject(new AbortedError("connect aborted"));
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    this.loop = this.run();
    try {
      await opened;
    } catch (err) {
      if (this.state !== "open") await this.close();
      throw err;
    } finally {
      opts.signal?.removeEventListener("abort", onAbort);
    }
  }

  /**
   * Publishes one message; resolves once the hub has stored it. Rejects with
   * `ConnectionLostError` if the connection drops before the hub's ack (it
   * may or may not be stored), `ForbiddenError` for a channel outside what
   * the hub allows this client, `NotConnectedError` when there is no
   * connection and none is coming. A full queue waits, bounded by `signal`.
   */
  async publish(channel: string, type: string, payload: unknown, opts: EphemeralPublishOptions = {}): Promise<EphemeralPublishResult> {
    if (this.state === "closed") throw new ClosedError("ephemeral messenger is closed");
    if (this.fatal) throw this.fatal;
    // A message must fit a batch, with room for the frame around it.
    const { body, id, ts } = buildEnvelope(this.name, labelledMessage(channel, type, payload, opts, this.cfg.serviceName), this.cfg.maxBatchBytes - 1024, this.ids);
    if (this.allowed && !this.allowed(channel)) throw new ForbiddenError(`the hub does not allow ${this.name} to publish on ${channel}`);
    if (this.state === "down" || (this.state !== "open" && !this.cfg.autoReconnect)) throw new NotConnectedError("not connected to the hub");
    while (this.queue.length >= this.cfg.queueSize) {
      if (opts.signal?.aborted) throw new AbortedError("publish aborted while waiting for queue room");
      await new Promise<void>((resolve) => {
        const done = () => {
          opts.signal?.removeEventListener("abort", done);
          resolve();
        };
        this.roomWaiters.push(done);
        opts.signal?.addEventListener("abort", done, { once: true });
      });
      // (The state may have changed while waiting.)
      const now = this.state as string;
      if (now === "closed") throw new ClosedError("ephemeral messenger is closed");
      if (this.fatal) throw this.fatal;
      if (now === "down") throw new NotConnectedError("the connection to the hub ended");
    }
    return new Promise<EphemeralPublishResult>((resolve, reject) => {
      this.queue.push({ channel, body, id, ts, resolve, reject });
      this.scheduleSend();
    });
  }

  /**
   * Calls `handler` for every live message of channels matching `pattern`
   * (which the `subscribe` patterns given at connect must cover for any to
   * arrive). Returns a function that removes the handler.
   */
  subscribe<T = unknown>(pattern: string, handler: EphemeralHandler<T>): () => void {
    assertPattern(pattern);
    if (typeof handler !== "function") throw new InvalidArgumentError("handler must be a function");
    const h = { match: compilePattern(pattern), fn: handler as EphemeralHandler };
    this.handlers.add(h);
    return () => void this.handlers.delete(h);
  }

  /** Closes the connection; unacknowledged publishes reject with `ConnectionLostError`, queued ones with `ClosedError`. */
  async close(): Promise<void> {
    if (this.state === "closed") return;
    this.state = "closed";
    this.session?.close("shutdown", "client closing");
    this.closing.abort("client closing");
    this.failInflight();
    for (const p of this.queue.splice(0)) p.reject(new ClosedError("ephemeral messenger closed before the message was sent"));
    for (const w of this.roomWaiters.splice(0)) w();
    this.firstOpen?.reject(new ClosedError("closed before connecting"));
    this.firstOpen = null;
    await this.loop;
    await this.delivery;
  }

  private async run(): Promise<void> {
    const redialer = new Redialer({
      baseMs: this.cfg.reconnectBaseMs,
      maxMs: this.cfg.reconnectMaxMs,
      jitter: this.cfg.reconnectJitter,
      onBackoff: (delay, ended) => {
        this.logger.info("ephemeral connection ended, reconnecting", { hub: this.cfg.hub, reason: ended.reason, delay_ms: delay });
        this.state = "backoff";
      },
    });
    await redialer.run(async (ctl) => {
      this.state = "connecting";
      const reason = await this.oneSession(ctl);
      this.session = null;
      if ((this.state as string) === "closed") return { reason, retry: false };
      this.failInflight();
      if (this.fatal) {
        for (const p of this.queue.splice(0)) p.reject(this.fatal);
        for (const w of this.roomWaiters.splice(0)) w();
        this.firstOpen?.reject(this.fatal);
        this.firstOpen = null;
        this.state = "down";
        this.cfg.onFatal?.(this.fatal);
        return { reason, retry: false };
      }
      if (!this.cfg.autoReconnect) {
        this.firstOpen?.reject(new NotConnectedError(`could not connect to ${this.cfg.hub}: ${reason}`));
        this.firstOpen = null;
        for (const p of this.queue.splice(0)) p.reject(new NotConnectedError(`connection to ${this.cfg.hub} ended before the message was sent: ${reason}`));
        for (const w of this.roomWaiters.splice(0)) w();
        this.state = "down";
        return { reason, retry: false };
      }
      return { reason, retry: true };
    }, this.closing.signal);
  }

  /** One connection attempt and, if it opens, its session; resolves with why it ended. */
  private oneSession(ctl: AttemptControl): Promise<string> {
    return new Promise<string>((resolveEnded) => {
      let ended = false;
      const end = (why: string) => {
        if (ended) return;
        ended = true;
        resolveEnded(why);
      };
      // The deadline passed (a connection that never got to a session), or the client is closing.
      ctl.signal.addEventListener(
        "abort",
        () => {
          if (this.state !== "closed") this.session?.close("handshake_timeout", "no session within the time limit", { hard: true });
          end(String(ctl.signal.reason));
        },
        { once: true },
      );
      const { hostname, port } = splitHostPort(this.cfg.hub);
      const material = this.material!;
      connectMtls<PeerSession>(
        { hostname, port, material, logger: this.logger, onReject: (reason) => end(`hub rejected: ${reason}`), onEarlyClose: () => end("connection closed during the TLS handshake") },
        sessionHandler(
          { role: "client", maxBody: this.cfg.maxBatchBytes + 64 * 1024, heartbeatMs: this.cfg.heartbeatMs, logger: this.logger },
          {
            onOpen: (s) => {
              ctl.opened();
              this.opened(s);
            },
            onBatch: (s, b) => this.received(s, b),
            onAck: (_s, a) => this.acked(a),
            onClose: (s, reason) => {
              const c = s.peerClose;
              if (c && FATAL_CODES.has(c.code)) this.fatal = new PeerRejectedError(`the hub refused ${material.name}: ${c.code}: ${c.reason}`);
              end(reason);
            },
          },
          (s) => {
            this.session = s;
            s.sendHello(
              clientHello({ name: material.name, mode: "ephemeral", publish: [">"], subscribe: this.cfg.subscribe, heartbeatMs: this.cfg.heartbeatMs, maxBatchBytes: this.cfg.maxBatchBytes }),
            );
          },
        ),
      ).catch((err) => end(`connect failed: ${err instanceof Error ? err.message : String(err)}`));
    });
  }

  private opened(s: PeerSession): void {
    const w = s.welcome!;
    this.allowed = compileRules(w.publish);
    this.cfg.maxBatchBytes = Math.min(this.cfg.maxBatchBytes, w.maxBatchBytes);
    this.state = "open";
    this.connects++;
    this.logger.info("ephemeral session open", { hub: this.cfg.hub, peer: s.peer.name });
    this.firstOpen?.resolve();
    this.firstOpen = null;
    // Publishes queued outside the hub's rules fail now rather than after a round trip.
    for (let i = this.queue.length - 1; i >= 0; i--) {
      const p = this.queue[i]!;
      if (!this.allowed(p.channel)) {
        this.queue.splice(i, 1);
        p.reject(new ForbiddenError(`the hub does not allow ${this.name} to publish on ${p.channel}`));
      }
    }
    this.scheduleSend();
  }

  private scheduleSend(): void {
    if (this.sendScheduled || this.state !== "open") return;
    this.sendScheduled = true;
    // Publishes made in the same turn share batches.
    setImmediate(() => {
      this.sendScheduled = false;
      this.sendQueued();
    });
  }

  /** Sends queued publishes, one channel per batch, while the window allows. */
  private sendQueued(): void {
    const s = this.session;
    if (!s || this.state !== "open") return;
    while (this.queue.length > 0 && this.inflight.size < this.cfg.window) {
      const channel = this.queue[0]!.channel;
      const take: Pending[] = [];
      let bytes = 0;
      // The oldest message's channel first; others of that channel join it, the rest keep their order.
      for (let i = 0; i < this.queue.length && bytes < this.cfg.maxBatchBytes - 1024; ) {
        const p = this.queue[i]!;
        if (p.channel === channel && bytes + p.body.length + 16 <= this.cfg.maxBatchBytes - 1024) {
          take.push(p);
          bytes += p.body.length + 16;
          this.queue.splice(i, 1);
        } else i++;
      }
      const batch = this.nextBatch++;
      const seqs = take.map(() => this.nextSeq++);
      this.inflight.set(batch, take);
      s.send(batchFrame({ batch, channel, seqs, records: take.map((p) => p.body) }));
    }
    for (const w of this.roomWaiters.splice(0, Math.max(0, this.cfg.queueSize - this.queue.length))) w();
  }

  private acked(a: Ack): void {
    const done = this.inflight.get(a.batch);
    if (!done) return;
    this.inflight.delete(a.batch);
    for (const p of done) p.resolve({ id: p.id, channel: p.channel, ts: p.ts });
    this.scheduleSend();
  }

  /** Live messages: handlers in arrival order, then the ACK (nothing is stored here). */
  private received(s: PeerSession, b: Batch): void {
    this.delivery = this.delivery.then(async () => {
      for (let i = 0; i < b.records.length; i++) {
        let msg: Message;
        try {
          msg = decodeEnvelope(b.records[i]!, b.seqs[i]!);
        } catch (err) {
          this.logger.error("undecodable record from the hub skipped", { channel: b.channel, seq: b.seqs[i], error: String(err) });
          continue;
        }
        for (const h of this.handlers) {
          if (!h.match(msg.channel)) continue;
          try {
            await h.fn(msg);
          } catch (err) {
            this.logger.error("ephemeral handler failed", { channel: msg.channel, id: msg.id, error: err instanceof Error ? err.message : String(err) });
          }
        }
      }
      if (s.state === "open") s.send(ackFrame({ batch: b.batch, channel: b.channel, upto: b.seqs[b.seqs.length - 1]! }));
    });
  }

  /** The connection ended: whatever the hub had not acknowledged may or may not be stored. */
  private failInflight(): void {
    for (const [, list] of this.inflight) {
      for (const p of list) p.reject(new ConnectionLostError(`connection to ${this.cfg.hub} lost before the hub acknowledged message ${p.id}`));
    }
    this.inflight.clear();
  }
}
