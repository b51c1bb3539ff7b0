/**
 * Federation for one agent: the hub listener (`hub.listen`, `hub.peers`) and
 * the client links (`links[]`), each session running a Forwarder (what this
 * side sends) and a Receiver (what it stores), over mutual TLS. Links
 * reconnect with exponential backoff and jitter (docs/protocol.md).
 */
import { compileRules, type Matcher } from "../envelope/names.ts";
import type { AgentConfig, LinkConfig, PeerConfig } from "../config/schema.ts";
import type { Messenger } from "../messenger/messenger.ts";
import type { DurableSubscriber } from "../messenger/durable-subscriber.ts";
import type { Logger } from "../observability/logger.ts";
import { connectMtls, MtlsServer } from "../pki/mtls.ts";
import type { TlsMaterial } from "../pki/tls.ts";
import { AuditLog } from "./audit.ts";
import { RecentIds } from "./dedup.ts";
import { envelopeId, scanEnvelope } from "../envelope/scan.ts";
import { backlogOf, cursorName, Forwarder, type ChannelBacklog } from "./forwarder.ts";
import { PROTOCOL_VERSION } from "./frame.ts";
import { clientHello, closeFrame } from "./messages.ts";
import { Receiver } from "./receiver.ts";
import { type PeerSession, sessionHandler, type SessionEvents } from "./session.ts";
import { type AttemptControl, type AttemptEnd, Redialer, splitHostPort } from "./redial.ts";

/** The parts of the agent's configuration federation runs on. */
export type FederationConfig = Pick<AgentConfig, "hub" | "links" | "federation" | "dedup" | "audit">;

/** What `/v1/status` shows of one link or hub peer. */
export interface LinkStatus {
  kind: "link" | "peer" | "ephemeral";
  /** host:port for links, CN for hub peers. */
  target: string;
  state: "connecting" | "open" | "backoff";
  peer: string | null;
  connected_since: string | null;
  reconnects: number;
  rtt_ms: number | null;
  unacked_batches: number;
  /** Messages this side stored from the peer since start. */
  stored: number;
  /** Per channel: messages waiting to be acknowledged by the peer. */
  backlog: ChannelBacklog[];
  last_error: string | null;
}

interface SessionParts {
  forwarder?: Forwarder;
  receiver: Receiver;
}

/** The federation side of an agent. */
export class Federation {
  private readonly messenger: Messenger;
  private readonly cfg: FederationConfig;
  private readonly logger: Logger;
  private material: TlsMaterial;
  private readonly audit: AuditLog | undefined;
  private readonly dedup: RecentIds;
  private server: MtlsServer<PeerSession> | null = null;
  private readonly parts = new Map<PeerSession, SessionParts>();
  private readonly peers = new Map<string, { cfg: PeerConfig; publish: Matcher; subscribe: Matcher }>();
  private readonly links: LinkRunner[] = [];
  private stopped = false;

  constructor(messenger: Messenger, cfg: FederationConfig, material: TlsMaterial, logger: Logger) {
    this.messenger = messenger;
    this.cfg = cfg;
    this.material = material;
    this.logger = logger;
    this.dedup = new RecentIds(cfg.dedup.capacity);
    this.audit = cfg.audit.path ? new AuditLog({ path: cfg.audit.path, maxFileBytes: cfg.audit.maxFileBytes, maxFiles: cfg.audit.maxFiles, logger }) : undefined;
    for (const p of cfg.hub?.peers ?? []) this.peers.set(p.name, { cfg: p, publish: compileRules(p.publish), subscribe: compileRules(p.subscribe) });
  }

  private cleanupTimer: ReturnType<typeof setInterval> | null = null;

  /**
   * Fills the duplicate filter with the ids of the newest records of every
   * channel (up to `dedup.capacity` in all, at most 10,000 per channel).
   * The filter lives in memory; without this, a batch that was stored just
   * before a crash but not yet acknowledged would be stored a second time
   * when the sender resends it after the restart. Returns the ids loaded.
   */
  async seedDedup(): Promise<number> {
    const logs = this.messenger.channelLogs();
    if (logs.length === 0 || this.dedup.capacity === 0) return 0;
    const per = Math.min(10_000, Math.max(1, Math.floor(this.dedup.capacity / logs.length)));
    let loaded = 0;
    for (const log of logs) {
      let from = Math.max(log.firstSeq, log.nextSeq - per);
      while (from < log.nextSeq) {
        const recs = await log.read(from, 1000);
        if (recs.length === 0) break;
        for (const r of recs) {
          try {
            this.dedup.seen(envelopeId(r.body, scanEnvelope(r.body)));
            loaded++;
          } catch {
            // not an envelope: nothing to remember
          }
        }
        from = recs[recs.length - 1]!.seq + 1;
      }
    }
    return loaded;
  }

  /**
   * Removes the federation cursors (`_fed.<peer>`) of peers not connected
   * for `federation.peer_expiry`, so a board that is gone for good stops
   * pinning retention. Returns the removed subscribers.
   */
  async cleanupPeerCursors(now = Date.now()): Promise<string[]> {
    const connected = new Set([...this.parts.keys()].map((s) => s.peer.name));
    const removed: string[] = [];
    for (const s of this.messenger.subscribers()) {
      if (!s.name.startsWith("_fed.")) continue;
      const peer = s.name.slice("_fed.".length);
      if (connected.has(peer) || now - s.touched <= this.cfg.federation.peerExpiryMs) continue;
      if (await this.messenger.deleteSubscriber(s.pattern, s.name)) {
        removed.push(`${s.name} on ${s.pattern}`);
        this.logger.warn("removed the federation cursor of a peer gone too long", { peer, pattern: s.pattern, last_seen: new Date(s.touched).toISOString() });
      }
    }
    return removed;
  }

  /** Starts the hub listener and every link. */
  start(): void {
    this.cleanupTimer = setInterval(
      () => void this.cleanupPeerCursors().catch((err) => this.logger.error("peer cursor clean-up failed (tried again at the next pass)", { error: String(err) })),
      Math.min(3_600_000, this.cfg.federation.peerExpiryMs),
    );
    this.cleanupTimer.unref?.();
    if (this.cfg.hub) {
      const { hostname, port } = splitHostPort(this.cfg.hub.listen);
      this.server = MtlsServer.listen<PeerSession>(
        {
          hostname,
          port,
          material: this.material,
          logger: this.logger,
          authorize: (p) => (this.peers.has(p.name) ? null : `unknown peer "${p.name}" (not in hub.peers)`),
          onReject: (reason, remote) => this.audit?.record("peer_rejected", { remote, reason }),
          farewell: (reason, why) => closeFrame({ code: why === "unknown" ? "unknown_peer" : "peer_rejected", reason }),
        },
        sessionHandler(this.sessionOptions("hub"), this.hubEvents()),
      );
      this.logger.info("hub listening", { listen: `${hostname}:${this.server.port}`, peers: [...this.peers.keys()] });
    }
    for (const l of this.cfg.links) {
      const runner = new LinkRunner(this, l);
      this.links.push(runner);
      void runner.run();
    }
  }

  /** The port the hub listens on (tests use port 0). */
  get hubPort(): number | undefined {
    return this.server?.port;
  }

  private sessionOptions(role: "client" | "hub") {
    return { role, maxBody: this.cfg.federation.maxBatchBytes + 64 * 1024, heartbeatMs: this.cfg.federation.heartbeatMs, logger: this.logger, audit: this.audit };
  }

  private forwarder(s: PeerSession, patterns: string[], start: "latest" | "earliest", allow?: (c: string) => boolean, cursors: "durable" | "volatile" = "durable"): Forwarder | undefined {
    const volatile = cursors === "volatile";
    if (patterns.length === 0) return undefined;
    const f = new Forwarder({
      messenger: this.messenger,
      session: s,
      patterns,
      start,
      allow,
      volatile,
      window: this.cfg.federation.window,
      maxBatchBytes: this.cfg.federation.maxBatchBytes,
      logger: this.logger,
    });
    void f.run().catch((err) => this.logger.error("forwarder stopped with an error", { peer: s.peer.name, error: String(err) }));
    return f;
  }

  private common(): Pick<SessionEvents, "onBatch" | "onAck" | "onClose"> {
    return {
      onBatch: (s, b) => this.parts.get(s)?.receiver.handle(s, b),
      onAck: (s, a) => this.parts.get(s)?.forwarder?.onAck(a),
      onClose: (s, reason) => {
        this.parts.get(s)?.forwarder?.stop();
        this.parts.delete(s);
        this.audit?.record("peer_disconnected", { peer: s.peer.name, reason });
      },
    };
  }

  private hubEvents(): SessionEvents {
    return {
      ...this.common(),
      onHello: (s, hello) => {
        const peer = this.peers.get(s.peer.name)!;
        this.parts.set(s, { receiver: new Receiver({ messenger: this.messenger, self: this.messenger.name, dedup: this.dedup, logger: this.logger, audit: this.audit, allow: peer.publish }) });
        return {
          version: PROTOCOL_VERSION,
          name: this.messenger.name,
          publish: peer.cfg.publish,
          subscribe: hello.subscribe,
          heartbeatMs: hello.heartbeatMs,
          maxBatchBytes: Math.min(hello.maxBatchBytes, this.cfg.federation.maxBatchBytes),
        };
      },
      onOpen: (s) => {
        const peer = this.peers.get(s.peer.name)!;
        const parts = this.parts.get(s)!;
        // Down: what the peer asked for, channel by channel limited to what it may receive.
        const allowDown = peer.subscribe;
        // An ephemeral peer gets live messages only: cursors in memory, gone with the session.
        // A link's cursor, made at its first session, starts where the link asked.
        parts.forwarder =
          s.hello!.mode === "ephemeral" ? this.forwarder(s, s.hello!.subscribe, "latest", allowDown, "volatile") : this.forwarder(s, s.hello!.subscribe, s.hello!.start ?? "latest", allowDown);
        this.audit?.record("peer_connected", { peer: s.peer.name, fingerprint: s.peer.fingerprint, mode: s.hello!.mode });
        this.logger.info("peer connected", { peer: s.peer.name, mode: s.hello!.mode });
      },
    };
  }

  /** @internal A link session's events. */
  linkEvents(link: LinkConfig, runner: LinkRunner): SessionEvents {
    return {
      ...this.common(),
      onOpen: (s) => {
        this.parts.set(s, {
          receiver: new Receiver({ messenger: this.messenger, self: this.messenger.name, dedup: this.dedup, logger: this.logger, audit: this.audit }),
          forwarder: this.forwarder(s, link.publish, link.start),
        });
        runner.opened(s);
        this.audit?.record("peer_connected", { peer: s.peer.name, hub: link.hub });
      },
      onClose: (s, reason) => {
        this.common().onClose!(s, reason);
        runner.closed(reason);
      },
    };
  }

  /** @internal Connects one link session. */
  async connect(link: LinkConfig, runner: LinkRunner): Promise<void> {
    const { hostname, port } = splitHostPort(link.hub);
    await connectMtls<PeerSession>(
      {
        hostname,
        port,
        material: this.material,
        logger: this.logger,
        onReject: (reason) => runner.closed(`hub rejected: ${reason}`),
        onEarlyClose: () => runner.closed("connection closed during the TLS handshake"),
      },
      sessionHandler(this.sessionOptions("client"), this.linkEvents(link, runner), (s) =>
        s.sendHello(
          clientHello({
            name: this.messenger.name,
            mode: "link",
            publish: link.publish,
            subscribe: link.subscribe,
            heartbeatMs: this.cfg.federation.heartbeatMs,
            maxBatchBytes: this.cfg.federation.maxBatchBytes,
            start: link.start,
          }),
        ),
      ),
    );
  }

  /** Backoff settings. */
  get backoff() {
    return this.cfg.federation;
  }

  get isStopped(): boolean {
    return this.stopped;
  }

  /** Links and connected hub peers. */
  status(): LinkStatus[] {
    const out: LinkStatus[] = this.links.map((l) => {
      const st = l.status();
      const parts = l.currentSession ? this.parts.get(l.currentSession) : undefined;
      if (parts) {
        st.unacked_batches = parts.forwarder?.unacked ?? 0;
        st.stored = parts.receiver.stats.stored;
      }
      // From the durable cursors, so a link that is down still shows what waits for it.
      if (l.lastPeer) st.backlog = this.backlogOf(l.lastPeer, l.config.publish);
      return st;
    });
    for (const [s, p] of this.parts) {
      if (s.role !== "hub") continue;
      out.push({
        kind: s.hello?.mode === "ephemeral" ? "ephemeral" : "peer",
        target: s.peer.name,
        state: s.state === "open" ? "open" : "connecting",
        peer: s.peer.name,
        connected_since: new Date(s.connectedAt).toISOString(),
        reconnects: 0,
        rtt_ms: s.rttMs ?? null,
        unacked_batches: p.forwarder?.unacked ?? 0,
        stored: p.receiver.stats.stored,
        backlog: p.forwarder?.backlog() ?? [],
        last_error: null,
      });
    }
    return out;
  }

  /** Per channel, what is stored here and not acknowledged by `peer`, from its durable cursors. */
  private backlogOf(peer: string, patterns: string[]): ChannelBacklog[] {
    const subs: DurableSubscriber[] = [];
    for (const p of patterns) {
      try {
        subs.push(this.messenger.openSubscriber(p, cursorName(peer), { create: false }));
      } catch {
        // never connected yet
      }
    }
    return backlogOf(this.messenger, subs);
  }

  /** Gauges for /metrics: link state, reconnects, RTT and backlog per peer and channel. */
  gauges(): Record<string, { help: string; value: number; labels?: Record<string, string> }[]> {
    const up: { help: string; value: number; labels: Record<string, string> }[] = [];
    const reconnects: typeof up = [];
    const rtt: typeof up = [];
    const backlog: typeof up = [];
    const backlogBytes: typeof up = [];
    for (const l of this.status()) {
      const labels = { kind: l.kind, target: l.target };
      up.push({ help: "1 when the link or peer session is open.", value: l.state === "open" ? 1 : 0, labels });
      if (l.kind === "link") reconnects.push({ help: "Times the link has reconnected since start.", value: l.reconnects, labels });
      if (l.rtt_ms !== null) rtt.push({ help: "Last heartbeat round trip of the session, seconds.", value: l.rtt_ms / 1000, labels });
      for (const b of l.backlog) {
        const where = { ...labels, peer: l.peer ?? "", channel: b.channel };
        backlog.push({ help: "Messages stored here and not yet acknowledged by the peer.", value: b.messages, labels: where });
        backlogBytes.push({ help: "Record bytes stored here and not yet acknowledged by the peer (to within 4 KiB).", value: b.bytes, labels: where });
      }
    }
    return {
      keyop_link_up: up,
      keyop_link_reconnects: reconnects,
      keyop_link_rtt_seconds: rtt,
      keyop_federation_backlog_messages: backlog,
      keyop_federation_backlog_bytes: backlogBytes,
      ...(this.audit
        ? {
            keyop_audit_write_failures: [{ help: "Audit trail appends that failed since start (each retried, lines kept).", value: this.audit.failedWriteCount }],
            keyop_audit_dropped_lines: [{ help: "Audit lines dropped since start because the queue was full.", value: this.audit.droppedLines }],
          }
        : {}),
    };
  }

  /** New TLS material for new connections (SIGHUP). */
  reloadTls(m: TlsMaterial): void {
    this.material = m;
    this.server?.reload(m);
  }

  /** @internal Current material for new link connections. */
  get tls(): TlsMaterial {
    return this.material;
  }

  /** Stops links and the listener, closing every session. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.cleanupTimer) clearInterval(this.cleanupTimer);
    for (const l of this.links) l.stop();
    for (const s of [...this.parts.keys()]) s.close("shutdown", "agent stopping");
    this.server?.stop(true);
    await this.audit?.flush();
    this.audit?.close();
  }
}

/** One configured link: connects, and reconnects with backoff when the session ends. */
class LinkRunner {
  private readonly fed: Federation;
  private readonly link: LinkConfig;
  /** Name (CN) of the hub at the last session: whose cursors hold this link's backlog. */
  lastPeer: string | null = null;
  private session: PeerSession | null = null;
  private state: LinkStatus["state"] = "connecting";
  private lastError: string | null = null;
  private readonly redialer: Redialer;
  private readonly stopping = new AbortController();
  /** The attempt running now: how it learns its session opened, and how it is ended. */
  private attempt: { ctl: AttemptControl; end: (reason: string) => void } | null = null;

  constructor(fed: Federation, link: LinkConfig) {
    this.fed = fed;
    this.link = link;
    const b = fed.backoff;
    this.redialer = new Redialer({
      baseMs: b.reconnectBaseMs,
      maxMs: b.reconnectMaxMs,
      jitter: b.reconnectJitter,
      onBackoff: () => {
        this.session = null;
        this.state = "backoff";
      },
    });
  }

  async run(): Promise<void> {
    await this.redialer.run(
      (ctl) =>
        new Promise<AttemptEnd>((resolve) => {
          this.state = "connecting";
          const end = (reason: string) => {
            if (this.attempt?.ctl !== ctl) return; // this attempt already ended (a refusal is followed by the socket's close)
            this.attempt = null;
            this.lastError = reason;
            resolve({ reason, retry: !this.fed.isStopped });
          };
          this.attempt = { ctl, end };
          ctl.signal.addEventListener("abort", () => end(String(ctl.signal.reason)), { once: true });
          this.fed.connect(this.link, this).catch((err: unknown) => end(err instanceof Error ? err.message : String(err)));
        }),
      this.stopping.signal,
    );
  }

  /** The link's configuration. */
  get config(): LinkConfig {
    return this.link;
  }

  opened(s: PeerSession): void {
    this.session = s;
    this.lastPeer = s.peer.name;
    this.state = "open";
    this.lastError = null;
    this.attempt?.ctl.opened();
  }

  closed(reason: string): void {
    this.attempt?.end(reason);
  }

  status(): LinkStatus {
    const s = this.session;
    return {
      kind: "link",
      target: this.link.hub,
      state: this.state,
      peer: s?.peer.name ?? null,
      connected_since: s && this.state === "open" ? new Date(s.connectedAt).toISOString() : null,
      reconnects: this.redialer.reconnects,
      rtt_ms: s?.rttMs ?? null,
      unacked_batches: 0,
      stored: 0,
      backlog: [],
      last_error: this.lastError,
    };
  }

  /** The open session, if any. */
  get currentSession(): PeerSession | null {
    return this.session;
  }

  stop(): void {
    this.closed("agent stopping");
    this.stopping.abort("agent stopping");
  }
}
