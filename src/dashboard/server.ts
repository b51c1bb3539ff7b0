/**
 * The dashboard: one page served by the agent itself (its HTML, script and
 * the chart library built into the binary, nothing from a CDN), fed by a
 * snapshot of the agent every 2 s over SSE. Access: a loopback address,
 * or client certificates from the keyop CA (`dashboard.tls`), or logins
 * (`dashboard.users`, argon2id hashes as for MQTT).
 *
 *   GET /               the page
 *   GET /assets/...     its script and the chart library
 *   GET /api/snapshot   the snapshot as JSON
 *   GET /api/events     SSE: the snapshot, then every 2 s what changed in it
 *
 * A hub's fleet table is most of a snapshot (1.2 MiB for 5,000 peers), and
 * most rows stay as they were from one snapshot to the next: a page gets
 * the whole snapshot once (`snapshot` events), then `update` events with
 * the rows that changed, the names of those that went, and the chart
 * points only when there is a new one.
 */
import type { Server } from "bun";
import uplotCss from "uplot/dist/uPlot.min.css" with { type: "text" };
import uplotJs from "uplot/dist/uPlot.iife.min.js" with { type: "text" };
import type { DashboardConfig } from "../config/schema.ts";
import { InUseError } from "../errors.ts";
import { splitHostPort } from "../federation/redial.ts";
import type { Logger } from "../observability/logger.ts";
import type { TlsMaterial } from "../pki/tls.ts";
import pageHtml from "./page.html" with { type: "text" };
import pageJs from "./page.js" with { type: "text" };

/** How often the page gets a new snapshot (ms). */
export const SNAPSHOT_EVERY_MS = 2000;
/** How long a checked login is trusted before its hash is checked again (ms): argon2id is slow on purpose. */
const LOGIN_CACHE_MS = 5 * 60_000;

export interface DashboardOptions {
  config: DashboardConfig;
  tls: TlsMaterial | undefined;
  logger: Logger;
  /** The snapshot the page shows (JSON-ready). */
  snapshot: () => Promise<unknown>;
  /** Events a page may leave unread before it is dropped (it reconnects and starts over); default 30, a minute's worth. */
  maxQueuedEvents?: number;
}

export class DashboardServer {
  private server: Server<undefined> | null = null;
  private readonly logins = new Map<string, number>();
  private readonly clients = new Set<ReadableStreamDefaultController<Uint8Array>>();
  /** Pages that have not had a whole snapshot yet. */
  private readonly fresh = new Set<ReadableStreamDefaultController<Uint8Array>>();
  /** The fleet rows of the last snapshot sent, as JSON, by name. */
  private rows = new Map<string, string>();
  private historyMark = "";
  private timer: ReturnType<typeof setInterval> | null = null;
  private building = false;

  private constructor(private readonly o: DashboardOptions) {}

  static start(o: DashboardOptions): DashboardServer {
    const d = new DashboardServer(o);
    const { hostname, port } = splitHostPort(o.config.listen);
    const tls =
      o.config.tls && o.tls
        ? // The browser must show a certificate the keyop CA issued; Bun checks the chain in the handshake.
          { cert: o.tls.certPem, key: o.tls.keyPem, ca: o.tls.caPem, requestCert: true, rejectUnauthorized: true }
        : undefined;
    try {
      d.server = Bun.serve({ hostname, port, idleTimeout: 0, ...(tls ? { tls } : {}), fetch: (req) => d.handle(req) });
    } catch (err) {
      throw new InUseError(`cannot serve the dashboard on ${o.config.listen}: ${err instanceof Error ? err.message : String(err)}`);
    }
    o.logger.info("dashboard listening", { address: `${tls ? "https" : "http"}://${hostname}:${d.server.port}/`, logins: o.config.users.length > 0, client_certificates: Boolean(tls) });
    return d;
  }

  get port(): number | undefined {
    return this.server?.port;
  }

  /** Pages with an open event stream. */
  get openPages(): number {
    return this.clients.size;
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    for (const c of this.clients) {
      try {
        c.close();
      } catch {
        // already closed
      }
    }
    this.clients.clear();
    this.server?.stop(true);
    this.server = null;
  }

  private async handle(req: Request): Promise<Response> {
    if (req.method !== "GET") return new Response("only GET\n", { status: 405, headers: { allow: "GET" } });
    const denied = await this.authorize(req);
    if (denied) return denied;
    const path = new URL(req.url).pathname;
    const headers = (type: string) => ({ "content-type": type, "cache-control": "no-store", "x-content-type-options": "nosniff" });
    switch (path) {
      case "/":
        return new Response(pageHtml as unknown as string, { headers: { ...headers("text/html; charset=utf-8"), "content-security-policy": "default-src 'self'; style-src 'self' 'unsafe-inline'" } });
      case "/assets/page.js":
        return new Response(pageJs, { headers: headers("text/javascript; charset=utf-8") });
      case "/assets/uplot.js":
        return new Response(uplotJs, { headers: headers("text/javascript; charset=utf-8") });
      case "/assets/uplot.css":
        return new Response(uplotCss, { headers: headers("text/css; charset=utf-8") });
      case "/api/snapshot":
        return new Response(JSON.stringify(await this.o.snapshot()), { headers: headers("application/json") });
      case "/api/events":
        return this.events();
      default:
        return new Response("not found\n", { status: 404 });
    }
  }

  /** Null when `req` may see the dashboard, else the answer that refuses it. */
  private async authorize(req: Request): Promise<Response | null> {
    const users = this.o.config.users;
    if (users.length === 0) return null; // loopback, or client certificates checked in the handshake
    const h = req.headers.get("authorization") ?? "";
    const refuse = () => new Response("login required\n", { status: 401, headers: { "www-authenticate": 'Basic realm="keyop", charset="UTF-8"' } });
    if (!h.startsWith("Basic ")) return refuse();
    const now = Date.now();
    const known = this.logins.get(h);
    if (known !== undefined && known > now) return null;
    let name = "";
    let password = "";
    try {
      const text = Buffer.from(h.slice(6), "base64").toString("utf8");
      const i = text.indexOf(":");
      name = text.slice(0, i);
      password = text.slice(i + 1);
    } catch {
      return refuse();
    }
    const user = users.find((u) => u.name === name);
    const ok = user ? await Bun.password.verify(password, user.passwordHash).catch(() => false) : false;
    if (!ok) {
      this.o.logger.warn("dashboard login refused", { user: name });
      return refuse();
    }
    if (this.logins.size > 1000) this.logins.clear();
    this.logins.set(h, now + LOGIN_CACHE_MS);
    return null;
  }

  /** An SSE stream: the snapshot now and every SNAPSHOT_EVERY_MS, built once per tick for every page open. */
  private events(): Response {
    let me: ReadableStreamDefaultController<Uint8Array> | null = null;
    const body = new ReadableStream<Uint8Array>({
      start: (controller) => {
        me = controller;
        this.clients.add(controller);
        this.fresh.add(controller);
        controller.enqueue(new TextEncoder().encode(`retry: ${SNAPSHOT_EVERY_MS}\n\n`));
        void this.tick();
        if (!this.timer) {
          this.timer = setInterval(() => void this.tick(), SNAPSHOT_EVERY_MS);
          this.timer.unref?.();
        }
      },
      cancel: () => {
        if (me) {
          this.clients.delete(me);
          this.fresh.delete(me);
        }
        if (this.clients.size === 0 && this.timer) {
          clearInterval(this.timer);
          this.timer = null;
        }
      },
    });
    return new Response(body, { headers: { "content-type": "text/event-stream", "cache-control": "no-store" } });
  }

  private async tick(): Promise<void> {
    if (this.building || this.clients.size === 0) return;
    this.building = true;
    try {
      const snap = (await this.o.snapshot()) as { fleet?: { name: string }[]; history?: { t: number }[] } & Record<string, unknown>;
      const enc = new TextEncoder();
      const fleet = snap.fleet ?? [];
      const rows = new Map<string, string>();
      const changed: string[] = [];
      for (const r of fleet) {
        const text = JSON.stringify(r);
        rows.set(r.name, text);
        if (this.rows.get(r.name) !== text) changed.push(text);
      }
      const removed = [...this.rows.keys()].filter((name) => !rows.has(name));
      this.rows = rows;
      const history = snap.history ?? [];
      const mark = `${history.length}:${history[history.length - 1]?.t ?? 0}`;
      const newPoints = mark !== this.historyMark;
      this.historyMark = mark;
      const { fleet: _f, history: _h, ...rest } = snap;
      let full: Uint8Array | null = null;
      let update: Uint8Array | null = null;
      for (const c of [...this.clients]) {
        const whole = this.fresh.has(c);
        let data: Uint8Array;
        if (whole) data = full ??= enc.encode(`event: snapshot\ndata: ${JSON.stringify(snap)}\n\n`);
        else {
          const parts = [`"fleet_changed":[${changed.join(",")}]`, `"fleet_removed":${JSON.stringify(removed)}`];
          if (newPoints) parts.push(`"history":${JSON.stringify(history)}`);
          data = update ??= enc.encode(`event: update\ndata: ${JSON.stringify(rest).slice(0, -1)},${parts.join(",")}}\n\n`);
        }
        // A page that stopped reading (a stalled tab, a link gone quiet) would pile up snapshots
        // here without end: past the limit it is dropped, and its EventSource starts over.
        if ((c.desiredSize ?? 0) < -(this.o.maxQueuedEvents ?? 30)) {
          this.clients.delete(c);
          this.fresh.delete(c);
          try {
            c.error(new Error("the page is not reading its events"));
          } catch {
            // already closed
          }
          this.o.logger.warn("dashboard page dropped: it left too many events unread");
          continue;
        }
        try {
          c.enqueue(data);
          this.fresh.delete(c);
        } catch {
          this.clients.delete(c);
          this.fresh.delete(c);
        }
      }
    } catch (err) {
      this.o.logger.warn("dashboard snapshot failed", { error: String(err) });
    } finally {
      this.building = false;
    }
  }
}
