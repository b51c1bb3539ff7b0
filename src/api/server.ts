/**
 * The local API: HTTP/1.1 (and WebSocket) over a Unix socket (docs/api.md).
 *
 * Routing is by hand on purpose: the path is split on "/" before each
 * segment is percent-decoded, so `..%2F..%2Fetc` stays one segment and then
 * fails channel validation; no request can name a file. Only a publish is
 * matched by Bun's router first, and only a valid channel name is taken
 * from it (one segment, decoded to nothing but `[A-Za-z0-9_.-]`).
 */
import { chmod } from "node:fs/promises";
import { unlinkIfExists } from "../store/fsync-dir.ts";
import type { Server } from "bun";
import { assertChannel, assertName, assertPattern, isChannel } from "../envelope/names.ts";
import { BadRequestError, InUseError, KeyopError } from "../errors.ts";
import { splitHostPort } from "../federation/redial.ts";
import type { Messenger, MessengerStats } from "../messenger/messenger.ts";
import type { LogHealth } from "../store/channel-log.ts";
import type { Logger } from "../observability/logger.ts";
import type { ExtraGauges } from "../observability/metrics.ts";
import { renderMetrics } from "./metrics.ts";
import { handleRequest } from "./request.ts";
import { boolParam, errorBody, errorResponse, fromParam, intParam, json, requiredParam, statusOf } from "./http.ts";
import { handleImport } from "./import.ts";
import { handlePublish, type PublishLimits } from "./publish.ts";
import { prepareSocketPath } from "../net/socket-file.ts";
import { DEFAULT_ACK_WAIT_MS, QueueStreamSession, type Stream, StreamRegistry, StreamSession, streamResponse, wsHandlers, type WsData } from "./stream.ts";
import { handleAck, handleDeleteSubscriber, handlePull } from "./subscribers.ts";

/** What the API server needs. */
export interface ApiServerOptions {
  socketPath: string;
  socketMode: number;
  messenger: Messenger;
  limits: PublishLimits;
  logger: Logger;
  /** Fields the agent adds to /v1/status (version, links, ...). */
  status: () => Record<string, unknown>;
  /** Gauges the agent adds to /metrics. */
  gauges?: () => ExtraGauges;
  /** Awaited before /v1/status and /metrics are rendered (figures that take a read to know). */
  beforeReport?: () => Promise<void>;
  /** host:port where /metrics and /healthz are also served over TCP (nothing else is). */
  metricsListen?: string | undefined;
  /** `POST /v1/reload`: reads the configuration again and applies it. */
  reload?: () => Promise<ReloadReport>;
}

/** What a reload did (the answer of `POST /v1/reload`). */
export interface ReloadReport {
  ok: boolean;
  applied: string[];
  restart_needed: string[];
  problems: string[];
}

/** A running API server. */
export class ApiServer {
  private readonly opts: ApiServerOptions;
  private server: Server<WsData> | null = null;
  private metricsServer: Server<undefined> | null = null;
  private readonly streams = new StreamRegistry();
  private draining = false;
  /** Aborted at stop: long-polls return at once with what they have. */
  private readonly shutdown = new AbortController();
  private inflight = 0;
  private idle: (() => void) | null = null;

  private constructor(opts: ApiServerOptions) {
    this.opts = opts;
  }

  /** Probes and replaces a stale socket file, listens, and sets the file mode. */
  static async start(opts: ApiServerOptions): Promise<ApiServer> {
    const api = new ApiServer(opts);
    const how = await prepareSocketPath(opts.socketPath);
    if (how === "stale-removed") opts.logger.warn("removed stale socket file from an earlier run", { socket: opts.socketPath });
    // Create the socket with the final mode already in force, not world-accessible for a moment.
    const old = process.umask(0o777 & ~opts.socketMode);
    try {
      const serveOptions = {
        unix: opts.socketPath,
        maxRequestBodySize: Math.max(opts.limits.maxBatchBytes, opts.limits.maxMessageBytes) + 1024,
        // A publish, the API's hot path, is matched by Bun's router without building a URL;
        // anything its router would read differently from `route` goes there (`publishRoute`).
        routes: { "/v1/channels/:channel/messages": { POST: (req: Bun.BunRequest<"/v1/channels/:channel/messages">, server: Server<WsData>) => api.publishRoute(req, server) } },
        fetch: (req: Request, server: Server<WsData>) => api.handle(req, server),
        websocket: wsHandlers,
        error: (err: Error) => errorResponse(err),
      };
      // No idle timeout: streams, long-polls and requests wait longer than Bun's 10 s default, and
      // `server.timeout(req, 0)` does not lift it for them. A Unix socket's peer that dies closes it.
      // (Bun's types omit idleTimeout for Unix sockets; it applies to them all the same.)
      api.server = Bun.serve<WsData>({ ...serveOptions, idleTimeout: 0 } as typeof serveOptions);
    } finally {
      process.umask(old);
    }
    await chmod(opts.socketPath, opts.socketMode);
    opts.logger.info("api listening", { socket: opts.socketPath, mode: "0" + opts.socketMode.toString(8) });
    if (opts.metricsListen) {
      const { hostname, port } = splitHostPort(opts.metricsListen);
      try {
        api.metricsServer = Bun.serve({ hostname, port, fetch: (req) => api.metricsOnly(req) });
      } catch (err) {
        await api.stop();
        throw new InUseError(`cannot serve metrics on ${opts.metricsListen}: ${err instanceof Error ? err.message : String(err)}`);
      }
      opts.logger.info("metrics listening", { address: `${hostname}:${api.metricsServer.port}` });
    }
    return api;
  }

  private async reload(): Promise<Response> {
    if (!this.opts.reload) return errorBody(404, "not_found", "this agent has no configuration to reload");
    const r = await this.opts.reload();
    if (!r.ok) return json(400, { error: { code: "invalid_config", message: `invalid configuration, nothing changed:\n  ${r.problems.join("\n  ")}`, problems: r.problems } });
    return json(200, r);
  }

  /** The port metrics are served on over TCP, if they are. */
  get metricsPort(): number | undefined {
    return this.metricsServer?.port;
  }

  /** The TCP listener for a Prometheus server: /metrics and /healthz, read-only, nothing else. */
  private async metricsOnly(req: Request): Promise<Response> {
    const path = new URL(req.url).pathname;
    if (req.method !== "GET") return methodNotAllowed("GET");
    if (path === "/healthz") return new Response("ok\n", { headers: { "content-type": "text/plain" } });
    if (path !== "/metrics") return errorBody(404, "not_found", "only /metrics and /healthz are served here");
    try {
      await this.report();
      return new Response(renderMetrics(this.opts.messenger, this.gauges()), { headers: { "content-type": "text/plain; version=0.0.4" } });
    } catch (err) {
      return errorResponse(err);
    }
  }

  /** Requests being handled now (streams included). */
  get requestsInFlight(): number {
    return this.inflight;
  }

  /** Open NDJSON, SSE and WebSocket streams. */
  get openStreams(): number {
    return this.streams.size;
  }

  private handle(req: Request, server: Server<WsData>): Promise<Response | undefined> {
    return this.serve(req, () => this.route(req, server));
  }

  /**
   * `POST /v1/channels/{channel}/messages` as Bun's router matched it. Its
   * parameter is percent-decoded without a check (`%ZZ` becomes U+FFFD), so a
   * name that is not a valid channel goes through `route`, which gives the
   * errors of docs/api.md; a valid one is the segment `route` would decode.
   */
  private publishRoute(req: Bun.BunRequest<"/v1/channels/:channel/messages">, server: Server<WsData>): Promise<Response | undefined> {
    const channel = req.params.channel;
    if (!isChannel(channel)) return this.handle(req, server);
    return this.serve(req, () => handlePublish(req, channel, this.opts.messenger, this.opts.limits));
  }

  /** Counts a request in flight, refuses it while draining, and answers what it throws. */
  private async serve(req: Request, work: () => Promise<Response | undefined> | Response | undefined): Promise<Response | undefined> {
    if (this.draining) return errorBody(503, "shutting_down", "keyop is shutting down");
    this.inflight++;
    try {
      return await work();
    } catch (err) {
      const status = statusOf(err);
      if (status >= 500 && !(err instanceof KeyopError && err.code === "disk_full")) {
        this.opts.logger.error("request failed", { method: req.method, path: new URL(req.url).pathname, error: String(err) });
      }
      await this.discardBody(req);
      return errorResponse(err);
    } finally {
      this.inflight--;
      if (this.inflight === 0) this.idle?.();
    }
  }

  /**
   * Reads and drops a request body nobody read (an error answered from the
   * path alone), so the connection can be kept or closed cleanly instead of
   * with unread bytes pending; bodies over the batch limit are left.
   */
  private async discardBody(req: Request): Promise<void> {
    const len = Number(req.headers.get("content-length") ?? 0);
    if (req.bodyUsed || !(len > 0) || len > this.opts.limits.maxBatchBytes) return;
    await req.arrayBuffer().catch(() => undefined); // the client went away mid-body: nothing to answer, nothing stored
  }

  private async route(req: Request, server: Server<WsData>): Promise<Response | undefined> {
    const url = new URL(req.url);
    const m = this.opts.messenger;
    const raw = url.pathname.split("/").slice(1);
    let seg = raw;
    // (Most paths hold no escape at all: nothing to decode, segment by segment.)
    if (url.pathname.includes("%")) {
      try {
        seg = raw.map(decodeURIComponent);
      } catch {
        throw new BadRequestError("path is not valid percent-encoding");
      }
    }
    const method = req.method;
    const p = seg.join("/");
    if (p === "healthz") return only(method, "GET") ?? new Response("ok\n", { headers: { "content-type": "text/plain" } });
    if (p === "metrics") {
      const refused = only(method, "GET");
      if (refused) return refused;
      await this.report();
      return new Response(renderMetrics(m, this.gauges()), { headers: { "content-type": "text/plain; version=0.0.4" } });
    }
    if (p === "v1/status") {
      const refused = only(method, "GET");
      if (refused) return refused;
      await this.report();
      return json(200, this.status());
    }
    if (p === "v1/channels") return only(method, "GET") ?? json(200, this.channels());
    if (p === "v1/import") return only(method, "POST") ?? handleImport(req, m, this.opts.limits.maxBatchBytes);
    if (p === "v1/reload") return only(method, "POST") ?? this.reload();
    if (seg[0] !== "v1" || seg[1] !== "channels" || seg.length < 4) return errorBody(404, "not_found", `no route for ${url.pathname}`);
    const target = seg[2]!;
    const rest = seg.slice(3).join("/");
    if (rest === "messages") {
      if (method === "POST") {
        assertChannel(target);
        return handlePublish(req, target, m, this.opts.limits);
      }
      if (method === "GET") {
        assertPattern(target);
        if (url.searchParams.get("wait")) server.timeout(req, 0); // a long-poll may outlast the idle timeout
        return handlePull(url, target, m, AbortSignal.any([req.signal, this.shutdown.signal]));
      }
      return methodNotAllowed("GET, POST");
    }
    if (rest === "requests") {
      if (method !== "POST") return methodNotAllowed("POST");
      assertChannel(target);
      server.timeout(req, 0); // the wait for the reply may outlast the idle timeout
      return handleRequest(req, url, target, m, this.opts.limits);
    }
    if (rest === "stream") {
      if (method !== "GET") return methodNotAllowed("GET");
      assertPattern(target);
      return this.openStream(req, url, target, server);
    }
    if (seg[3] === "subscribers" && seg.length === 5) {
      assertPattern(target);
      assertName(seg[4]);
      if (method === "DELETE") return handleDeleteSubscriber(target, seg[4], m);
      return methodNotAllowed("DELETE");
    }
    if (seg[3] === "subscribers" && seg.length === 6 && seg[5] === "ack") {
      assertPattern(target);
      assertName(seg[4]);
      if (method === "POST") return handleAck(req, target, seg[4], m);
      return methodNotAllowed("POST");
    }
    return errorBody(404, "not_found", `no route for ${url.pathname}`);
  }

  private openStream(req: Request, url: URL, pattern: string, server: Server<WsData>): Response | undefined {
    const name = requiredParam(url, "subscriber");
    const maxInflight = intParam(url, "max_inflight", 100, 1, 100_000);
    const autoAck = boolParam(url, "auto_ack");
    const queue = boolParam(url, "queue");
    const key = url.searchParams.get("key") ?? undefined;
    if (key !== undefined && !queue) throw new BadRequestError("key is for queue=true streams");
    if (key === "") throw new BadRequestError("key must name a payload field");
    const ackWait = intParam(url, "ack_wait_ms", DEFAULT_ACK_WAIT_MS, 0, 86_400_000);
    const m = this.opts.messenger;
    const sub = m.openSubscriber(pattern, name, { from: fromParam(url) });
    this.streams.check(sub, queue, m.queues);
    const session: Stream = queue
      ? new QueueStreamSession(m.queues, sub, { maxInflight, autoAck, key, ackWaitMs: ackWait === 0 ? Number.POSITIVE_INFINITY : ackWait })
      : new StreamSession(sub, { maxInflight, autoAck });
    if (req.headers.get("upgrade")?.toLowerCase() === "websocket") {
      if (server.upgrade(req, { data: { session, registry: this.streams, logger: this.opts.logger } })) return undefined;
      session.close();
      throw new BadRequestError("websocket upgrade failed");
    }
    server.timeout(req, 0); // streams stay open; keep-alives flow every HEARTBEAT_MS
    this.streams.add(session);
    const sse = (req.headers.get("accept") ?? "").includes("text/event-stream");
    return streamResponse(sse ? "sse" : "ndjson", session, this.streams);
  }

  private channels(): unknown {
    const st = this.opts.messenger.stats();
    return {
      channels: st.channels.map((c) => ({
        channel: c.channel,
        first_seq: c.firstSeq,
        next_seq: c.nextSeq,
        messages: c.messages,
        bytes: c.bytes,
        segments: c.segments,
        published: c.published,
        delivered: c.delivered,
        acked: c.acked,
        dead_lettered: c.deadLettered,
        expired: c.expired,
        rejected: c.rejected,
        superseded: c.superseded,
        disk: diskJson(c.disk),
        subscribers: c.subscribers.map((s) => ({ name: s.name, pattern: s.pattern, cursor: s.cursor, lag: s.lag, skipped: s.skipped, active: s.active, ...(s.queue ? { queue: s.queue } : {}) })),
      })),
    };
  }

  /** Samples what the agent reads before a report; a failure only leaves those figures as they were. */
  private async report(): Promise<void> {
    await this.opts.beforeReport?.().catch((err) => this.opts.logger.warn("could not sample figures for a report", { error: String(err) }));
  }

  private status(): Record<string, unknown> {
    const st = this.opts.messenger.stats();
    return {
      ...this.opts.status(),
      storage: {
        channels: st.totals.channels,
        messages: st.totals.messages,
        bytes: st.totals.bytes,
        subscribers: st.totals.subscribers,
        disk: storageDisk(st),
      },
      api: { socket: this.opts.socketPath, requests_in_flight: this.inflight, streams: this.streams.size, queue_groups: this.opts.messenger.queues.all().length },
    };
  }

  private gauges(): ExtraGauges {
    return {
      keyop_api_requests_in_flight: { help: "HTTP requests being handled on the API socket.", value: this.inflight },
      keyop_api_streams: { help: "Open NDJSON, SSE and WebSocket streams.", value: this.streams.size },
      ...this.opts.gauges?.(),
    };
  }

  /**
   * Stops taking requests (new ones get 503), ends open streams, waits up to
   * `graceMs` for requests in flight (publishes finish their durable write),
   * closes the listener and removes the socket file.
   */
  async stop(graceMs = 10_000): Promise<void> {
    this.metricsServer?.stop(true);
    this.metricsServer = null;
    if (!this.server) return;
    this.draining = true;
    this.shutdown.abort();
    this.streams.closeAll();
    if (this.inflight > this.streams.size) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, graceMs);
        this.idle = () => {
          clearTimeout(t);
          resolve();
        };
      });
    }
    // Let responses already produced be written, then force whatever is left (idle keep-alives).
    const server = this.server;
    this.server = null;
    await Promise.race([server.stop(false), Bun.sleep(Math.min(graceMs, 2000))]);
    await server.stop(true);
    await unlinkIfExists(this.opts.socketPath).catch((err) =>
      this.opts.logger.warn("could not remove the socket file (the next start removes it)", { socket: this.opts.socketPath, error: String(err) }),
    );
  }
}

function diskJson(h: LogHealth): Record<string, unknown> {
  return {
    state: h.state,
    error: h.error,
    failed_syncs: h.failedSyncs,
    reseals: h.reseals,
    lost_records: h.lostRecords,
    damaged_records: h.damagedRecords,
    damage: h.damage.map((d) => ({ segment: d.segment, offset: d.offset, bytes: d.bytes, first_seq: d.firstSeq, last_seq: d.lastSeq, reason: d.reason })),
  };
}

/**
 * The data directory's disk at a glance: "failing" while any channel
 * refuses appends or cursors wait on a failed write; the counters since
 * start; and the channels with anything to report, in full.
 */
function storageDisk(st: MessengerStats): Record<string, unknown> {
  const sum = (f: (h: LogHealth) => number) => st.channels.reduce((n, c) => n + f(c.disk), 0);
  const refusing = st.channels.filter((c) => c.disk.state === "failed").map((c) => c.channel);
  const cursorsFailing = st.cursors.failedWrites > 0 && st.cursors.pending > 0;
  return {
    state: refusing.length > 0 || cursorsFailing ? "failing" : "ok",
    refusing_channels: refusing,
    failed_syncs: sum((h) => h.failedSyncs),
    reseals: sum((h) => h.reseals),
    lost_records: sum((h) => h.lostRecords),
    damaged_records: sum((h) => h.damagedRecords),
    cursor_failed_writes: st.cursors.failedWrites,
    cursors_pending: st.cursors.pending,
    channels: st.channels
      .filter((c) => c.disk.state !== "ok" || c.disk.failedSyncs > 0 || c.disk.damagedRecords > 0 || c.disk.lostRecords > 0)
      .map((c) => ({ channel: c.channel, ...diskJson(c.disk) })),
  };
}

function only(method: string, allowed: string): Response | undefined {
  return method === allowed ? undefined : methodNotAllowed(allowed);
}

function methodNotAllowed(allow: string): Response {
  return new Response(JSON.stringify({ error: { code: "method_not_allowed", message: `use ${allow}` } }), {
    status: 405,
    headers: { "content-type": "application/json", allow },
  });
}
