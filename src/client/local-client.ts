/**
 * A client of the local API over the Unix socket, for Bun programs on the
 * board and for the `keyop` CLI itself, so that there is one implementation
 * of the HTTP protocol on the JS side. Messages come back in the library's
 * shape (camelCase `Message`).
 */
import type { Message } from "../envelope/envelope.ts";
import { isWildcard } from "../envelope/names.ts";
import { DEFAULT_DATA_DIR, SOCKET_NAME } from "../config/defaults.ts";

/** The socket a client uses: explicit, else $KEYOP_SOCKET, else the default. */
export function resolveSocket(explicit?: string): string {
  return explicit ?? process.env.KEYOP_SOCKET ?? `${DEFAULT_DATA_DIR}/${SOCKET_NAME}`;
}

/** An error answered by the agent: its JSON error code and HTTP status. */
export class ApiError extends Error {
  readonly code: string;
  readonly status: number;
  constructor(status: number, code: string, message: string) {
    super(message);
    this.name = "ApiError";
    this.code = code;
    this.status = status;
  }
}

/** The agent could not be reached on its socket. */
export class UnreachableError extends Error {
  readonly code = "unreachable";
  readonly socket: string;
  constructor(socket: string, cause: unknown) {
    super(`cannot reach keyop at ${socket}: ${cause instanceof Error ? cause.message : String(cause)} (is "keyop run" running?)`, { cause });
    this.name = "UnreachableError";
    this.socket = socket;
  }
}

/** What the agent answers to a publish. */
export interface PublishReceipt {
  id: string;
  channel: string;
  seq: number;
  ts: number;
}

/** One message of a batch publish. */
export interface OutgoingMessage {
  type: string;
  payload: unknown;
  correlationId?: string;
  serviceName?: string;
  /** Time to live, ms: after it the message is neither delivered nor forwarded. */
  ttlMs?: number;
  /** Bytes an MQTT 5 requester expects back with the reply (its correlation data). */
  correlationData?: Uint8Array;
}

/** Sharing a subscriber with other consumers (a queue group). */
export interface QueueOptions {
  /** Join the subscriber's queue group: each message goes to one member, acked by itself. */
  queue?: boolean;
  /** With `queue`: a payload field; messages with the same value go to the same member while it lives. */
  key?: string;
  /** With `queue`: how long a message may go unacked before it goes to another member (agent default 30 s; 0: never). */
  ackWaitMs?: number;
}

/** Options of a stream subscription. */
export interface StreamOptions extends QueueOptions {
  from?: "earliest" | "latest" | number;
  maxInflight?: number;
  autoAck?: boolean;
  signal?: AbortSignal;
}

/** Options of `LocalClient.subscribe`. */
export interface LocalSubscribeOptions extends QueueOptions {
  /** Where a new subscriber starts (an existing one resumes at its cursor). */
  from?: "earliest" | "latest" | number;
  /** Messages the agent sends ahead of acks (default 100). */
  maxInflight?: number;
  /** Stops the subscription (`done` resolves). */
  signal?: AbortSignal;
  /** First delay before reconnecting (default 200 ms), doubling to `reconnectMaxMs` (default 5 s). */
  reconnectBaseMs?: number;
  reconnectMaxMs?: number;
  /** Hears every error that made the stream reconnect (agent restarting, a handler that threw). */
  onError?: (err: unknown) => void;
}

/** A running `LocalClient.subscribe`. */
export interface LocalSubscription {
  /** Resolves when stopped; rejects on an error retrying cannot fix (a 4xx answer: bad channel or name). */
  done: Promise<void>;
  stop(): void;
}

/** Converts the wire form (snake_case) to the library's `Message`. */
export function fromWire(w: Record<string, unknown>): Message {
  const m: Message = {
    v: Number(w.v ?? 1),
    id: String(w.id),
    seq: Number(w.seq),
    ts: Number(w.ts),
    channel: String(w.channel),
    origin: String(w.origin ?? ""),
    type: String(w.type ?? ""),
    route: Array.isArray(w.route) ? w.route.map(String) : [],
    payload: w.payload,
  };
  if (typeof w.correlation_id === "string") m.correlationId = w.correlation_id;
  if (typeof w.service_name === "string") m.serviceName = w.service_name;
  if (typeof w.reply_to === "string") m.replyTo = w.reply_to;
  const cd = (w.correlation_data as { $base64?: unknown } | undefined)?.$base64;
  if (typeof cd === "string") m.correlationData = new Uint8Array(Buffer.from(cd, "base64"));
  if (typeof w.expires === "number") m.expires = w.expires;
  return m;
}

const wireOut = (m: OutgoingMessage) => {
  const o: Record<string, unknown> = { type: m.type, payload: m.payload ?? null };
  if (m.correlationId !== undefined) o.correlation_id = m.correlationId;
  if (m.serviceName !== undefined) o.service_name = m.serviceName;
  if (m.ttlMs !== undefined) o.ttl_ms = m.ttlMs;
  if (m.correlationData !== undefined) o.correlation_data = { $base64: Buffer.from(m.correlationData).toString("base64") };
  return o;
};

const seg = (s: string) => encodeURIComponent(s);

/** Client of one agent's Unix-socket API. */
export class LocalClient {
  readonly socket: string;

  constructor(opts: { socket?: string } = {}) {
    this.socket = resolveSocket(opts.socket);
  }

  /** One HTTP request; JSON answer parsed, API errors thrown as `ApiError`. */
  async call<T = unknown>(method: string, path: string, body?: string | Uint8Array, contentType = "application/json", signal?: AbortSignal): Promise<T> {
    let res: Response;
    try {
      res = await fetch(`http://keyop${path}`, {
        method,
        body,
        headers: body !== undefined ? { "content-type": contentType } : {},
        unix: this.socket,
        signal,
      } as RequestInit);
    } catch (err) {
      if ((err as Error)?.name === "AbortError") throw err;
      throw new UnreachableError(this.socket, err);
    }
    const text = await res.text();
    let parsed: unknown;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      parsed = text;
    }
    if (!res.ok) {
      const e = (parsed as { error?: { code?: string; message?: string } })?.error;
      throw new ApiError(res.status, e?.code ?? "http_" + res.status, e?.message ?? `HTTP ${res.status}`);
    }
    return parsed as T;
  }

  /** Publishes one message; resolves after the agent's durable write. */
  publish(channel: string, type: string, payload: unknown, opts: { correlationId?: string; serviceName?: string; ttlMs?: number; correlationData?: Uint8Array } = {}): Promise<PublishReceipt> {
    return this.call("POST", `/v1/channels/${seg(channel)}/messages`, JSON.stringify(wireOut({ type, payload, ...opts })));
  }

  /**
   * Sends a request and resolves with the reply (`ApiError` with code
   * `no_responders` or `timeout` otherwise; durable: stored even when
   * nobody is attached to answer now).
   */
  async request(channel: string, type: string, payload: unknown, opts: { correlationId?: string; serviceName?: string; timeoutMs?: number; durable?: boolean } = {}): Promise<Message> {
    const q = new URLSearchParams();
    if (opts.timeoutMs !== undefined) q.set("timeout_ms", String(Math.round(opts.timeoutMs)));
    if (opts.durable) q.set("durable", "true");
    const { timeoutMs: _t, durable: _d, ...fields } = opts;
    const w = await this.call<Record<string, unknown>>("POST", `/v1/channels/${seg(channel)}/requests?${q}`, JSON.stringify(wireOut({ type, payload, ...fields })));
    return fromWire(w);
  }

  /** Answers `request` (a message with `replyTo`): the reply goes to its requester only, and is not stored. */
  reply(request: Message, type: string, payload: unknown): Promise<PublishReceipt> {
    if (!request.replyTo) throw new Error(`message ${request.id} carries no reply_to: it is not a request`);
    return this.publish(request.replyTo, type, payload, { correlationId: request.id, ...(request.correlationData ? { correlationData: request.correlationData } : {}) });
  }

  /** Publishes many messages to one channel in one request (NDJSON). */
  async publishBatch(channel: string, messages: OutgoingMessage[]): Promise<PublishReceipt[]> {
    const body = messages.map((m) => JSON.stringify(wireOut(m))).join("\n") + "\n";
    const r = await this.call<{ results: PublishReceipt[] }>("POST", `/v1/channels/${seg(channel)}/messages`, body, "application/x-ndjson");
    return r.results;
  }

  /** Up to `max` messages after the subscriber's cursor (nothing is acked). */
  async pull(channel: string, subscriber: string, opts: { max?: number; waitMs?: number; from?: "earliest" | "latest" | number; signal?: AbortSignal } = {}): Promise<Message[]> {
    const q = new URLSearchParams({ subscriber });
    if (opts.max !== undefined) q.set("max", String(opts.max));
    if (opts.waitMs !== undefined) q.set("wait", String(Math.round(opts.waitMs)));
    if (opts.from !== undefined) q.set("from", String(opts.from));
    const r = await this.call<{ messages: Record<string, unknown>[] }>("GET", `/v1/channels/${seg(channel)}/messages?${q}`, undefined, undefined, opts.signal);
    return r.messages.map(fromWire);
  }

  /** Cumulative ack of `seq` (for a pattern subscriber, name the channel). */
  ack(pathChannel: string, subscriber: string, seq: number, channel?: string): Promise<{ cursor: number; channel: string }> {
    const body: Record<string, unknown> = { seq };
    if (channel !== undefined) body.channel = channel;
    return this.call("POST", `/v1/channels/${seg(pathChannel)}/subscribers/${seg(subscriber)}/ack`, JSON.stringify(body));
  }

  /** Removes a durable subscriber. */
  deleteSubscriber(channel: string, subscriber: string): Promise<unknown> {
    return this.call("DELETE", `/v1/channels/${seg(channel)}/subscribers/${seg(subscriber)}`);
  }

  /** `GET /v1/channels`. */
  channels(): Promise<{ channels: Record<string, unknown>[] }> {
    return this.call("GET", "/v1/channels");
  }

  /** `GET /v1/status`. */
  status(): Promise<Record<string, unknown>> {
    return this.call("GET", "/v1/status");
  }

  /**
   * A durable subscription over the stream, with the library's delivery
   * rules: `handler` gets each message in order per channel; when it
   * returns, the message is acked; when it throws, nothing more is acked,
   * and after a backoff the stream reconnects and the message comes again
   * (at-least-once). When the agent restarts or the socket goes away, the
   * stream reconnects by itself and resumes at the acked cursor.
   *
   * With `queue`, this is one member of the subscriber's queue group
   * (other processes, MQTT shared subscriptions, the agent's own workers):
   * it gets its share of the messages, each acked by itself; what it had
   * not acked when it stopped or died goes to another member.
   */
  subscribe(channel: string, subscriber: string, handler: (msg: Message) => unknown | Promise<unknown>, opts: LocalSubscribeOptions = {}): LocalSubscription {
    const stopper = new AbortController();
    const signal = opts.signal ? AbortSignal.any([opts.signal, stopper.signal]) : stopper.signal;
    const base = opts.reconnectBaseMs ?? 200;
    const max = opts.reconnectMaxMs ?? 5000;
    const wildcard = isWildcard(channel);
    const done = (async () => {
      let delay = base;
      while (!signal.aborted) {
        try {
          const { queue, key, ackWaitMs } = opts;
          for await (const msg of this.stream(channel, subscriber, { from: opts.from, maxInflight: opts.maxInflight ?? 100, signal, queue, key, ackWaitMs })) {
            delay = base;
            await handler(msg);
            // Handled is handled: acked even if a stop came meanwhile.
            await this.ack(channel, subscriber, msg.seq, wildcard ? msg.channel : undefined);
            if (signal.aborted) return;
          }
          if (signal.aborted) return;
        } catch (err) {
          if (signal.aborted) return;
          // A refused request (bad channel or name) will not get better.
          if (err instanceof ApiError && err.status >= 400 && err.status < 500) throw err;
          opts.onError?.(err);
        }
        await new Promise<void>((r) => {
          const t = setTimeout(r, delay);
          signal.addEventListener("abort", () => (clearTimeout(t), r()), { once: true });
        });
        delay = Math.min(delay * 2, max);
      }
    })();
    return { done, stop: () => stopper.abort() };
  }

  /**
   * Streams messages (NDJSON) until `signal` aborts or the agent ends the
   * stream. Ack with `ack()`; unacked messages come again on the next stream.
   */
  async *stream(channel: string, subscriber: string, opts: StreamOptions = {}): AsyncGenerator<Message> {
    const q = new URLSearchParams({ subscriber });
    if (opts.from !== undefined) q.set("from", String(opts.from));
    if (opts.maxInflight !== undefined) q.set("max_inflight", String(opts.maxInflight));
    if (opts.autoAck) q.set("auto_ack", "true");
    if (opts.queue) q.set("queue", "true");
    if (opts.key !== undefined) q.set("key", opts.key);
    if (opts.ackWaitMs !== undefined) q.set("ack_wait_ms", String(Math.round(opts.ackWaitMs)));
    let res: Response;
    try {
      res = await fetch(`http://keyop/v1/channels/${seg(channel)}/stream?${q}`, { unix: this.socket, signal: opts.signal } as RequestInit);
    } catch (err) {
      if ((err as Error)?.name === "AbortError") return;
      throw new UnreachableError(this.socket, err);
    }
    if (!res.ok || !res.body) {
      const e = ((await res.json().catch(() => ({}))) as { error?: { code?: string; message?: string } }).error;
      throw new ApiError(res.status, e?.code ?? "http_" + res.status, e?.message ?? `HTTP ${res.status}`);
    }
    const dec = new TextDecoder();
    let rest = "";
    try {
      for await (const chunk of res.body as AsyncIterable<Uint8Array>) {
        rest += dec.decode(chunk, { stream: true });
        for (let nl = rest.indexOf("\n"); nl >= 0; nl = rest.indexOf("\n")) {
          const line = rest.slice(0, nl);
          rest = rest.slice(nl + 1);
          if (line.trim() !== "") yield fromWire(JSON.parse(line));
        }
      }
    } catch (err) {
      if ((err as Error)?.name === "AbortError" || opts.signal?.aborted) return;
      throw err;
    }
  }
}
