/**
 * `GET /v1/channels/{channel}/stream?subscriber=NAME&from=&max_inflight=N&auto_ack=true`
 *
 * Push delivery of a durable subscriber over one of three transports on the
 * same path: NDJSON (default), SSE (`Accept: text/event-stream`) or a
 * WebSocket (upgrade; the client sends `{"ack":seq}`). At most
 * `max_inflight` messages are sent and not yet acked; a new stream starts
 * at the acked cursor, so whatever a dropped stream had not acked comes
 * again. One stream per subscriber: a new one replaces the old.
 */
import type { ServerWebSocket, WebSocketHandler } from "bun";
import { envelopeJson } from "../envelope/json.ts";
import type { Message } from "../envelope/envelope.ts";
import { BadRequestError, KeyopError } from "../errors.ts";
import { CursorReader, MESSAGES } from "../messenger/cursor-reader.ts";
import type { DurableSubscriber } from "../messenger/durable-subscriber.ts";
import { Window } from "../messenger/window.ts";
import type { Logger } from "../observability/logger.ts";
import { ackChannel } from "./subscribers.ts";

/** How often an idle stream sends a keep-alive (ms). */
export const HEARTBEAT_MS = 15_000;
/** Most messages handed to the transport at once. */
const BATCH = 256;

/** Window and acking mode of one stream. */
export interface StreamOptions {
  maxInflight: number;
  autoAck: boolean;
}

/** The delivery state of one open stream: a cursor reader whose window counts messages. */
export class StreamSession {
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
    if (typeof seq !== "number" || !Number.isInteger(seq) || seq < 0) throw new BadRequestError('"ack" must be a non-negative integer seq');
    return this.reader.ackThrough(ackChannel(this.sub, channel), seq);
  }
}

/** Active streams, one per subscriber: opening a second closes the first. */
export class StreamRegistry {
  private readonly active = new Map<string, StreamSession>();

  /** Registers `s`, closing the stream it replaces. */
  add(s: StreamSession): void {
    const key = `${s.sub.pattern}\u0000${s.sub.name}`;
    this.active.get(key)?.close();
    this.active.set(key, s);
  }

  /** Forgets `s` if it is still the registered one. */
  remove(s: StreamSession): void {
    const key = `${s.sub.pattern}\u0000${s.sub.name}`;
    if (this.active.get(key) === s) this.active.delete(key);
  }

  /** Number of open streams. */
  get size(): number {
    return this.active.size;
  }

  /** Closes every stream (agent shutdown). */
  closeAll(): void {
    for (const s of this.active.values()) s.close();
    this.active.clear();
  }
}

const enc = new TextEncoder();

/** An NDJSON or SSE response body fed by `session`, with backpressure. */
export function streamResponse(kind: "ndjson" | "sse", session: StreamSession, registry: StreamRegistry): Response {
  const body = new ReadableStream<Uint8Array>(
    {
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
  session: StreamSession;
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
