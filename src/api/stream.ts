/**
 * `GET /v1/channels/{channel}/stream?subscriber=NAME&from=&max_inflight=N&auto_ack=true&queue=true&key=F&ack_wait_ms=N`
 *
 * Push delivery of a durable subscriber over one of three transports on the
 * same path: NDJSON (default), SSE (`Accept: text/event-stream`) or a
 * WebSocket (upgrade; the client sends `{"ack":seq}`). At most
 * `max_inflight` messages are sent and not yet acked.
 *
 * Without `queue`, a stream has the subscriber to itself: acks are
 * cumulative, a new stream starts at the acked cursor (so whatever a dropped
 * stream had not acked comes again) and replaces the old one. With
 * `queue=true`, streams on one subscriber are members of its queue group:
 * each message goes to one of them, is acked by itself, and goes to another
 * member when its stream closes or `ack_wait_ms` passes without an ack.
 */
import type { ServerWebSocket, WebSocketHandler } from "bun";
import { envelopeJson } from "../envelope/json.ts";
import type { Message } from "../envelope/envelope.ts";
import { decodeEnvelope } from "../envelope/envelope.ts";
import { BadRequestError, ConflictError, InvalidArgumentError, KeyopError, UnknownChannelError } from "../errors.ts";
import { CursorReader, MESSAGES } from "../messenger/cursor-reader.ts";
import type { QueueDelivery, QueueGroup, QueueGroups, QueueMember } from "../messenger/queue-group.ts";
import type { DurableSubscriber } from "../messenger/durable-subscriber.ts";
import { Window } from "../messenger/window.ts";
import type { Logger } from "../observability/logger.ts";
import { ackChannel } from "./subscribers.ts";

/** How often an idle stream sends a keep-alive (ms). */
export const HEARTBEAT_MS = 15_000;
/** How long a queue group member may hold a message unacked before it goes to another, by default (ms). */
export const DEFAULT_ACK_WAIT_MS = 30_000;
/** Most messages handed to the transport at once. */
const BATCH = 256;

/** Window and acking mode of one stream. */
export interface StreamOptions {
  maxInflight: number;
  autoAck: boolean;
}

/** What the transports need of a stream, whichever kind. */
export interface Stream {
  readonly sub: DurableSubscriber;
  /** A member of the subscriber's queue group, not its only consumer. */
  readonly queue: boolean;
  readonly closed: boolean;
  close(): void;
  /** The next messages to send; [] after `idleMs` with nothing (send a keep-alive); null once closed. */
  next(idleMs?: number): Promise<Message[] | null>;
  /** The client acked `seq` (on `channel`); returns the subscriber's cursor on that channel. */
  ack(seq: unknown, channel?: unknown): number;
}

function checkSeq(seq: unknown): asserts seq is number {
  if (typeof seq !== "number" || !Number.isInteger(seq) || seq < 0) throw new BadRequestError('"ack" must be a non-negative integer seq');
}

/** The delivery state of one exclusive stream: a cursor reader whose window counts messages. */
export class StreamSession implements Stream {
  readonly queue = false;
  readonly sub: DurableSubscriber;
  private readonly reader: CursorReader<Message>;
  private readonly autoAck: boolean;
  private readonly abort = new AbortController();

  constructor(sub: DurableSubscriber, opts: StreamOptions) {
    this.sub = sub;
    this.autoAck = opts.autoAck;
    // Auto-acked messages are done as they are handed to the transport: no window to wait on.
    // Acks are cumulative, so a delivery is the run of one channel, and the window counts messages.
    const window = new Window(opts.autoAck ? Number.POSITIVE_INFINITY : opts.maxInflight);
    this.reader = new CursorReader(sub, { form: MESSAGES, window, unit: "run", windowCounts: "records", maxRecords: BATCH });
  }

  /** True once closed (client gone, replaced, or agent stopping). */
  get closed(): boolean {
    return this.abort.signal.aborted;
  }

  /** Ends the stream; a waiting `next` returns null. */
  close(): void {
    this.abort.abort();
    this.reader.stop();
  }

  /** Messages sent on this stream and not yet acked. */
  inflight(): number {
    return this.reader.inflight;
  }

  /**
   * The next messages to send; [] when `idleMs` passed with nothing to send
   * (send a keep-alive), null when the stream is closed.
   */
  async next(idleMs = HEARTBEAT_MS): Promise<Message[] | null> {
    const ds = await this.reader.next({ idleMs, signal: this.abort.signal });
    if (ds === null) return null;
    if (this.autoAck) for (const d of ds) this.reader.ack(d);
    return ds.length === 1 ? ds[0]!.records : ds.flatMap((d) => d.records);
  }

  /** Acks `seq` on `channel` (the stream's channel when it is not a pattern), cumulatively. */
  ack(seq: unknown, channel?: unknown): number {
    checkSeq(seq);
    return this.reader.ackThrough(ackChannel(this.sub, channel), seq);
  }
}

/** Options of a queue group member stream. */
export interface QueueStreamOptions extends StreamOptions {
  /** A payload field: messages with the same value go to the same member while it lives. */
  key?: string;
  /** How long a message may go unacked before it goes to another member (ms; Infinity: never). */
  ackWaitMs: number;
}

/**
 * One stream of a queue group: a member with room for `max_inflight`
 * unacked messages (with `auto_ack`, a batch's worth waiting to be
 * written), which holds what the group gave it until the transport takes it.
 */
export class QueueStreamSession implements Stream, QueueMember {
  readonly queue = true;
  readonly sub: DurableSubscriber;
  readonly ackWaitMs: number;
  private readonly queues: QueueGroups;
  private readonly group: QueueGroup;
  private readonly window: Window;
  private readonly autoAck: boolean;
  /** Given by the group and not yet handed to the transport. */
  private buffer: QueueDelivery[] = [];
  private wake: (() => void) | null = null;
  private done = false;

  constructor(queues: QueueGroups, sub: DurableSubscriber, opts: QueueStreamOptions) {
    this.sub = sub;
    this.queues = queues;
    this.autoAck = opts.autoAck;
    this.ackWaitMs = opts.autoAck ? Number.POSITIVE_INFINITY : opts.ackWaitMs;
    this.window = new Window(opts.autoAck ? BATCH : opts.maxInflight);
    this.group = queues.join(sub, this, { key: opts.key });
  }

  get closed(): boolean {
    return this.done;
  }

  room(): number {
    return this.done ? 0 : this.window.room();
  }

  onRoom(fn: () => void): () => void {
    return this.window.onRoom(fn);
  }

  take(d: QueueDelivery): boolean {
    this.window.take(0);
    this.buffer.push(d);
    const w = this.wake;
    this.wake = null;
    w?.();
    return true;
  }

  release(d: QueueDelivery): void {
    // Taken back (its ack wait passed) before the transport took it: not sent at all.
    const i = this.buffer.indexOf(d);
    if (i >= 0) this.buffer.splice(i, 1);
    this.window.give(0);
  }

  async next(idleMs = HEARTBEAT_MS): Promise<Message[] | null> {
    if (this.buffer.length === 0 && !this.done) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(finish, idleMs);
        const self = this;
        function finish() {
          clearTimeout(t);
          if (self.wake === finish) self.wake = null;
          resolve();
        }
        this.wake = finish;
      });
    }
    if (this.done) return null;
    const ds = this.buffer;
    this.buffer = [];
    const out: Message[] = [];
    for (const d of ds) {
      try {
        out.push(decodeEnvelope(d.record.body, d.seq));
      } catch {
        this.group.ack(d); // not an envelope: never handed to a client
        continue;
      }
      // Auto-acked messages are done once handed to the transport.
      if (this.autoAck) this.group.ack(d);
    }
    return out;
  }

  ack(seq: unknown, channel?: unknown): number {
    checkSeq(seq);
    const c = ackChannel(this.sub, channel);
    const end = this.sub.nextSeqOf(c);
    if (end === undefined) throw new UnknownChannelError(c);
    if (seq >= end) throw new InvalidArgumentError(`seq ${seq} is past the end of channel ${c} (next seq ${end})`);
    // Whichever member holds it: a late ack of one already handed on still counts. A seq the
    // group has no open message for was acked already (or is behind the cursor).
    this.group.ackSeq(c, seq);
    return this.sub.cursorOf(c) ?? end;
  }

  /** Leaves the group: what this stream was sent and did not ack goes to another member. */
  close(): void {
    if (this.done) return;
    this.done = true;
    this.queues.leave(this.group, this);
    const w = this.wake;
    this.wake = null;
    w?.();
  }
}

/**
 * Open streams: an exclusive one per subscriber (opening a second closes
 * the first), or any number of queue group members.
 */
export class StreamRegistry {
  private readonly exclusive = new Map<string, StreamSession>();
  private readonly members = new Map<string, Set<Stream>>();

  private static key(sub: DurableSubscriber): string {
    return `${sub.pattern}\u0000${sub.name}`;
  }

  /**
   * Refuses a stream of the other kind than the subscriber has: an exclusive
   * stream on a queue group (in this agent: streams, MQTT shared
   * subscriptions, in-process workers), a queue member beside an exclusive stream.
   */
  check(sub: DurableSubscriber, queue: boolean, queues: QueueGroups): void {
    const key = StreamRegistry.key(sub);
    if (queue && this.exclusive.has(key)) throw new ConflictError(`subscriber ${sub.name} on ${sub.pattern} has an exclusive stream; close it, or open every stream with queue=true`);
    const g = queues.get(sub.pattern, sub.name);
    if (!queue && g) throw new ConflictError(`subscriber ${sub.name} on ${sub.pattern} is a queue group of ${g.size} consumers; open the stream with queue=true`);
  }

  /** Registers `s`; an exclusive stream closes the one it replaces. */
  add(s: Stream): void {
    const key = StreamRegistry.key(s.sub);
    if (s instanceof StreamSession) {
      const old = this.exclusive.get(key);
      if (old !== s) old?.close();
      this.exclusive.set(key, s);
      return;
    }
    let set = this.members.get(key);
    if (!set) {
      set = new Set();
      this.members.set(key, set);
    }
    set.add(s);
  }

  /** Forgets `s`. */
  remove(s: Stream): void {
    const key = StreamRegistry.key(s.sub);
    if (this.exclusive.get(key) === s) this.exclusive.delete(key);
    const set = this.members.get(key);
    if (set?.delete(s) && set.size === 0) this.members.delete(key);
  }

  /** Number of open streams. */
  get size(): number {
    let n = this.exclusive.size;
    for (const set of this.members.values()) n += set.size;
    return n;
  }

  /** Closes every stream (agent shutdown). */
  closeAll(): void {
    for (const s of this.exclusive.values()) s.close();
    for (const set of this.members.values()) for (const s of set) s.close();
    this.exclusive.clear();
    this.members.clear();
  }
}

const enc = new TextEncoder();

/** An NDJSON or SSE response body fed by `session`, with backpressure. */
export function streamResponse(kind: "ndjson" | "sse", session: Stream, registry: StreamRegistry): Response {
  const body = new ReadableStream<Uint8Array>(
    {
      start(controller) {
        // A keep-alive at once, so the client has the answer's headers before the first message.
        controller.enqueue(enc.encode(kind === "ndjson" ? "\n" : ": open\n\n"));
      },
      async pull(controller) {
        const msgs = await session.next();
        if (msgs === null) {
          registry.remove(session);
          controller.close();
          return;
        }
        if (kind === "ndjson") {
          controller.enqueue(enc.encode(msgs.length === 0 ? "\n" : msgs.map(envelopeJson).join("\n") + "\n"));
        } else {
          const text = msgs.length === 0 ? ": keep-alive\n\n" : msgs.map((m) => `id: ${m.channel}:${m.seq}\nevent: message\ndata: ${envelopeJson(m)}\n\n`).join("");
          controller.enqueue(enc.encode(text));
        }
      },
      cancel() {
        session.close();
        registry.remove(session);
      },
    },
    { highWaterMark: 0 },
  );
  const type = kind === "ndjson" ? "application/x-ndjson" : "text/event-stream";
  return new Response(body, { status: 200, headers: { "content-type": type, "cache-control": "no-store" } });
}

/** Data attached to an upgraded WebSocket. */
export interface WsData {
  session: Stream;
  registry: StreamRegistry;
  logger: Logger;
  drained?: () => void;
}

async function pump(ws: ServerWebSocket<WsData>): Promise<void> {
  const { session } = ws.data;
  while (true) {
    const msgs = await session.next();
    if (msgs === null) break;
    if (msgs.length === 0) {
      ws.ping();
      continue;
    }
    for (const m of msgs) if (ws.send(envelopeJson(m)) === 0) return session.close();
    if (ws.getBufferedAmount() > 1 << 20) await new Promise<void>((r) => (ws.data.drained = r));
  }
  if (ws.readyState === 1) ws.close(4000, "stream closed (replaced by a newer stream or agent stopping)");
}

/** Bun.serve websocket handlers for upgraded stream requests. */
export const wsHandlers: WebSocketHandler<WsData> = {
  open(ws) {
    ws.data.registry.add(ws.data.session);
    void pump(ws).catch((err) => {
      ws.data.logger.error("websocket stream failed", { error: String(err) });
      ws.close(1011, "internal error");
    });
  },
  message(ws, raw) {
    let msg: { ack?: unknown; channel?: unknown };
    try {
      msg = JSON.parse(typeof raw === "string" ? raw : new TextDecoder().decode(raw));
      if (msg === null || typeof msg !== "object") throw new Error();
    } catch {
      ws.send(JSON.stringify({ error: { code: "bad_request", message: 'send acks as {"ack": seq}' } }));
      return;
    }
    try {
      ws.data.session.ack(msg.ack, msg.channel);
    } catch (err) {
      const code = err instanceof KeyopError ? err.code : "internal";
      ws.send(JSON.stringify({ error: { code, message: err instanceof Error ? err.message : String(err) } }));
    }
  },
  drain(ws) {
    const d = ws.data.drained;
    ws.data.drained = undefined;
    d?.();
  },
  close(ws) {
    ws.data.session.close();
    ws.data.registry.remove(ws.data.session);
    const d = ws.data.drained;
    ws.data.drained = undefined;
    d?.();
  },
  maxPayloadLength: 64 * 1024,
  idleTimeout: 0,
};
