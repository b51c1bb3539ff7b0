/**
 * Federation for one agent: the hub listener (`hub.listen`, `hub.peers`) and
 * the client links (`links[]`), each session running a Forwarder (what this
 * side sends) and a Receiver (what it stores), over mutual TLS. Links
 * reconnect with exponential backoff and jitter (docs/protocol.md).
 */
import { compilePattern, compileRules, type Matcher } from "../envelope/names.ts";
import type { AgentConfig, LinkConfig, PeerConfig } from "../config/schema.ts";
import type { Messenger } from "../messenger/messenger.ts";
import type { DurableSubscriber } from "../messenger/durable-subscriber.ts";
import type { Logger } from "../observability/logger.ts";
import { connectMtls, MtlsServer } from "../pki/mtls.ts";
import type { TlsMaterial } from "../pki/tls.ts";
import { type AuditEvent, AuditLog } from "./audit.ts";
import { RecentIds } from "./dedup.ts";
import { backlogOf, cursorName, Forwarder, holdPeer, type Sender } from "./forwarder.ts";
import type { ChannelBacklog, Link, LinkInfo } from "./link.ts";
import { type LinkDialer, LinkRunner } from "./link-runner.ts";
import { removeExpiredPeerCursors, seedDuplicateFilter } from "./peer-cursors.ts";
import { PROTOCOL_VERSION } from "./frame.ts";
import { clientHello, closeFrame } from "./messages.ts";
import { Receiver } from "./receiver.ts";
import { type HubStore, messengerSink, type RecordSink } from "./sink.ts";
import { type PeerSession, sessionHandler, type SessionEvents } from "./session.ts";
import { splitHostPort } from "./redial.ts";
import { codecsFor } from "./compression.ts";
import { compilePriorities, DEFAULT_PRIORITY } from "./priority.ts";
import { OldestTimes, withAges } from "./health.ts";
import { ReplyRoutes } from "./reply-routes.ts";
import type { FleetPeer, PeerSeen } from "./fleet.ts";
import { replyFrame, type Reply } from "./messages.ts";

/** The parts of the agent's configuration federation runs on. */
export type FederationConfig = Pick<AgentConfig, "hub" | "links" | "federation" | "dedup" | "audit">;

interface SessionParts {
  forwarder?: Sender | undefined;
  receiver: Receiver;
}

/**
 * A hub tier (docs/scale-out.md): where the records peers send are stored,
 * and what sends peers their channels, instead of this instance's log.
 */
export interface HubTier {
  store: HubStore;
  sender(
    session: Link,
    o: {
      patterns: string[];
      allow: Matcher;
      start: "latest" | "earliest";
      volatile: boolean;
      audit: AuditLog | undefined;
      laneOf?: ((channel: string) => number) | undefined;
      maxBytesPerS?: number | undefined;
      /** Told of each request sent to the peer: its inbox and when it expires. */
      onRequest?: ((inbox: string, expires: number) => void) | undefined;
    },
  ): Sender;
  /**
   * A reply from a peer to a request that entered the tier from elsewhere
   * (a NATS client): sent on towards its requester; false when its inbox is
   * not one of the tier's.
   */
  reply?(inbox: string, body: Uint8Array): boolean;
}

/** The federation side of an agent. */
export class Federation implements LinkDialer {
  private readonly messenger: Messenger;
  private cfg: FederationConfig;
  private readonly logger: Logger;
  private material: TlsMaterial;
  private readonly audit: AuditLog | undefined;
  private readonly dedup: RecentIds;
  private server: MtlsServer<PeerSession> | null = null;
  private readonly parts = new Map<PeerSession, SessionParts>();
  private readonly peers = new Map<string, { cfg: PeerConfig; publish: Matcher; subscribe: Matcher; laneOf: (channel: string) => number }>();
  private readonly runners: LinkRunner[] = [];
  private stopped = false;
  /** Where records from links are stored: the log. */
  private readonly localSink: RecordSink;
  /** Where records from hub peers are stored: the log, or a hub tier's engine. */
  private readonly hubSink: RecordSink;
  private readonly hubStore: HubStore | undefined;
  private readonly tier: HubTier | undefined;
  /** Publish times of the oldest unacknowledged message of each backlog (sampled by `sampleHealth`). */
  private readonly oldest = new OldestTimes();
  /** Sessions the stall watchdog ended, per hub peer. */
  private readonly peerStalls = new Map<string, number>();
  /** Where replies to requests that crossed this instance go, and whom they may come from. */
  private readonly replies = new ReplyRoutes();
  /** Hub side: each peer's sessions since start (the fleet table). */
  private readonly seen = new Map<string, PeerSeen>();
  /** The fleet table's oldest-message times (its backlogs are not the status's). */
  private readonly fleetOldest = new OldestTimes();

  /** `tier`: a hub tier's engine (JetStream) instead of the log, for what peers send and receive. */
  constructor(messenger: Messenger, cfg: FederationConfig, material: TlsMaterial, logger: Logger, tier?: HubTier) {
    this.messenger = messenger;
    this.localSink = messengerSink(messenger);
    this.tier = tier;
    this.hubStore = tier?.store;
    this.hubSink = this.hubStore ?? this.localSink;
    this.cfg = cfg;
    this.material = material;
    this.logger = logger;
    this.dedup = new RecentIds(cfg.dedup.capacity);
    this.audit = cfg.audit.path ? new AuditLog({ path: cfg.audit.path, maxFileBytes: cfg.audit.maxFileBytes, maxFiles: cfg.audit.maxFiles, logger }) : undefined;
    for (const p of cfg.hub?.peers ?? []) this.peers.set(p.name, compilePeer(p));
  }

  private cleanupTimer: ReturnType<typeof setInterval> | null = null;

  /** Fills the duplicate filter from the newest records of every channel (see `seedDuplicateFilter`). */
  seedDedup(): Promise<number> {
    return seedDuplicateFilter(this.messenger, this.dedup);
  }

  /** Removes the federation cursors of peers gone longer than `federation.peer_expiry`; returns what it removed. */
  cleanupPeerCursors(now = Date.now()): Promise<string[]> {
    const connected = new Set([...this.parts.keys()].map((s) => s.peer.name));
    // A link's hold stays while the link is configured, however long it has been offline.
    for (const l of this.cfg.links) connected.add(holdPeer(l.hubs));
    return removeExpiredPeerCursors(this.messenger, connected, this.cfg.federation.peerExpiryMs, now, this.logger);
  }

  /**
   * A link that has never had a session has no cursors yet (they are named
   * by its hub's certificate): its backlog is held from now by cursors of
   * its own, which its first session takes over. Without them nothing
   * would pin what a board publishes before it first reaches its hub, and
   * a `reject` channel would let go of it.
   */
  private holdNeverConnected(): void {
    for (const l of this.cfg.links) {
      const hold = cursorName(holdPeer(l.hubs));
      for (const p of l.publish) {
        if (this.linkCursorPeer(l, p) !== null) continue;
        try {
          this.messenger.openSubscriber(p, hold, { from: l.start }).touch();
        } catch (err) {
          this.logger.error("could not hold a link's backlog before its first session", { hub: l.hubs.join(","), pattern: p, error: String(err) });
        }
      }
    }
  }

  /**
   * The hub whose cursors hold a link's pattern `p` from an earlier session
   * (a `_fed.` subscriber of the pattern that is neither a hold nor a peer
   * of this hub), or null.
   */
  private linkCursorPeer(link: LinkConfig, p?: string): string | null {
    for (const s of this.messenger.subscribers()) {
      if (!s.name.startsWith("_fed.") || s.name.startsWith("_fed..hold-")) continue;
      const peer = s.name.slice("_fed.".length);
      if (this.peers.has(peer)) continue;
      if (p === undefined ? link.publish.includes(s.pattern) : s.pattern === p) return peer;
    }
    return null;
  }

  /** A link's first session: its cursors start where its hold stood, and the hold goes. */
  private takeOverHold(link: LinkConfig, hub: string): void {
    const hold = cursorName(holdPeer(link.hubs));
    const held = this.messenger.subscribers().filter((s) => s.name === hold);
    for (const h of held) {
      if (link.publish.includes(h.pattern)) this.messenger.openSubscriber(h.pattern, cursorName(hub), { like: hold });
      void this.messenger
        .deleteSubscriber(h.pattern, hold)
        .catch((err) => this.logger.warn("could not remove a link's hold (removed at the next session)", { pattern: h.pattern, error: String(err) }));
    }
  }

  /**
   * A reply from peer `s`: taken only if the request went to that peer. It
   * goes to the request waiting here, or on back towards its requester.
   */
  private takeReply(s: PeerSession, r: Reply): void {
    if (!this.replies.accepts(r.inbox, s.peer.name)) {
      this.audit?.record("policy_violation", { peer: s.peer.name, channel: r.inbox, reason: "a reply to a request that was not sent to this peer (or has expired)" });
      return;
    }
    if (!this.messenger.deliverForeignReply(r.inbox, r.body) && !this.sendBack(r.inbox, r.body) && !this.tier?.reply?.(r.inbox, r.body)) {
      this.logger.info("a reply found no request waiting (it timed out, or its way back is down)", { peer: s.peer.name, inbox: r.inbox });
    }
    this.replies.done(r.inbox);
  }

  /** Sends a reply towards the peer its request came from; false when there is none or it is not connected. */
  private sendBack(inbox: string, body: Uint8Array): boolean {
    const back = this.replies.backTo(inbox);
    if (back === undefined) return false;
    for (const s of this.parts.keys()) {
      if (s.peer.name !== back || s.state !== "open") continue;
      this.replies.done(inbox);
      s.send(replyFrame({ inbox, body }));
      return true;
    }
    return false;
  }

  /** Starts the hub listener and every link. */
  start(): void {
    // A reply published here to a request that came over a link goes back over it.
    this.messenger.foreignReply = (inbox, _msg, body) => this.sendBack(inbox, body);
    // A request that only a link would carry, while that link is down: unreachable, not "nobody".
    this.messenger.routeDown = (channel) => {
      for (const r of this.runners) {
        if (r.currentSession?.state === "open" || !r.config.publish.some((p) => compilePattern(p)(channel))) continue;
        return `the link to ${r.address} is ${r.info().state}${r.info().lastError ? ` (${r.info().lastError})` : ""}`;
      }
      return undefined;
    };
    this.holdNeverConnected();
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
      this.runners.push(runner);
      void runner.run();
    }
  }

  /** The port the hub listens on (tests use port 0). */
  get hubPort(): number | undefined {
    return this.server?.port;
  }

  private sessionOptions(role: "client" | "hub") {
    return {
      role,
      maxBody: this.cfg.federation.maxBatchBytes + 64 * 1024,
      heartbeatMs: this.cfg.federation.heartbeatMs,
      logger: this.logger,
      audit: this.audit,
      compression: codecsFor(this.cfg.federation.compression),
    };
  }

  private forwarder(
    s: PeerSession,
    patterns: string[],
    start: "latest" | "earliest",
    allow?: Matcher,
    cursors: "durable" | "volatile" = "durable",
    shape: { laneOf?: (channel: string) => number; maxBytesPerS?: number | undefined; onStall?: () => void } = {},
  ): Sender | undefined {
    const volatile = cursors === "volatile";
    if (patterns.length === 0) return undefined;
    // A hub tier's peers read the tier's streams; links and a hub on its own log read the log.
    let tierSender: Sender | undefined;
    if (this.tier && s.role === "hub") {
      try {
        tierSender = this.tier.sender(s, {
          patterns,
          allow: allow ?? (() => true),
          start,
          volatile,
          audit: this.audit,
          laneOf: shape.laneOf,
          maxBytesPerS: shape.maxBytesPerS,
          onRequest: (inbox, expires) => this.replies.sent(inbox, s.peer.name, expires),
        });
      } catch (err) {
        s.close("unavailable", `cannot read the streams: ${err instanceof Error ? err.message : String(err)}`);
        return undefined;
      }
    }
    const f: Sender =
      tierSender ??
      new Forwarder({
        messenger: this.messenger,
        session: s,
        patterns,
        start,
        allow,
        volatile,
        window: this.cfg.federation.window,
        maxBatchBytes: this.cfg.federation.maxBatchBytes,
        logger: this.logger,
        onRequest: (inbox, expires) => this.replies.sent(inbox, s.peer.name, expires),
        stallMs: this.cfg.federation.stallHeartbeats * (s.welcome?.heartbeatMs ?? this.cfg.federation.heartbeatMs),
        ...shape,
        onStall: () => {
          shape.onStall?.();
          this.audit?.record("link_stalled", { peer: s.peer.name });
        },
      });
    void f.run().catch((err) => {
      this.logger.error("forwarder stopped with an error", { peer: s.peer.name, error: String(err) });
      // A tier that cannot read its streams: the peer comes back later, to this hub or another.
      if (this.tier && s.role === "hub") s.close("unavailable", `cannot read the streams: ${String(err)}`);
    });
    return f;
  }

  private common(): Pick<SessionEvents, "onBatch" | "onAck" | "onClose" | "onReply"> {
    return {
      onBatch: (s, b) => this.parts.get(s)?.receiver.handle(s, b),
      onAck: (s, a) => this.parts.get(s)?.forwarder?.onAck(a),
      onReply: (s, r) => this.takeReply(s, r),
      onClose: (s, reason) => {
        const parts = this.parts.get(s);
        parts?.forwarder?.stop();
        parts?.receiver.stop();
        this.parts.delete(s);
        if (s.role === "hub") {
          const seen = this.seen.get(s.peer.name);
          if (seen) {
            seen.lastSeenMs = Date.now();
            seen.lastReason = reason;
          }
        }
        this.audit?.record("peer_disconnected", { peer: s.peer.name, reason });
      },
    };
  }

  private hubEvents(): SessionEvents {
    return {
      ...this.common(),
      onHello: (s, hello) => {
        const peer = this.peers.get(s.peer.name)!;
        // Nothing could be acknowledged: the peer keeps its backlog and comes back (not fatal).
        const down = this.hubStore?.unavailable();
        if (down) return { refuse: `the hub's store is unavailable: ${down}`, code: "unavailable" };
        this.parts.set(s, {
          receiver: new Receiver({
            sink: this.hubSink,
            self: this.messenger.name,
            dedup: this.dedup,
            logger: this.logger,
            audit: this.audit,
            // Looked up per batch: a reload that narrows the peer's rules applies from the next one.
            allow: (c) => this.peers.get(s.peer.name)?.publish(c) ?? false,
            onRequest: (inbox, expires) => this.replies.received(inbox, s.peer.name, expires),
          }),
        });
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
        // Down: what the peer asked for, channel by channel limited to what it may receive now.
        const allowDown = (c: string) => this.peers.get(s.peer.name)?.subscribe(c) ?? false;
        // An ephemeral peer gets live messages only: cursors in memory, gone with the session.
        // A link's cursor, made at its first session, starts where the link asked.
        const shape = { laneOf: peer.laneOf, maxBytesPerS: peer.cfg.maxBytesPerS, onStall: () => this.peerStalls.set(s.peer.name, (this.peerStalls.get(s.peer.name) ?? 0) + 1) };
        parts.forwarder =
          s.hello!.mode === "ephemeral"
            ? this.forwarder(s, s.hello!.subscribe, "latest", allowDown, "volatile", shape)
            : this.forwarder(s, s.hello!.subscribe, s.hello!.start ?? "latest", allowDown, "durable", shape);
        const seen = this.seen.get(s.peer.name);
        this.seen.set(s.peer.name, {
          lastSeenMs: Date.now(),
          connects: (seen?.connects ?? 0) + 1,
          certNotAfter: s.peer.notAfter.getTime(),
          lastReason: null,
          ephemeral: s.hello!.mode === "ephemeral",
        });
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
        this.takeOverHold(link, s.peer.name);
        this.parts.set(s, {
          receiver: new Receiver({
            sink: this.localSink,
            self: this.messenger.name,
            dedup: this.dedup,
            logger: this.logger,
            audit: this.audit,
            onRequest: (inbox, expires) => this.replies.received(inbox, s.peer.name, expires),
          }),
          forwarder: this.forwarder(s, link.publish, link.start, undefined, "durable", {
            laneOf: compilePriorities(link.publishLanes),
            maxBytesPerS: link.maxBytesPerS,
            onStall: () => runner.stalls++,
          }),
        });
        runner.opened(s);
        this.audit?.record("peer_connected", { peer: s.peer.name, hub: runner.address });
      },
      onClose: (s, reason) => {
        this.common().onClose!(s, reason);
        runner.closed(reason);
      },
    };
  }

  /** @internal Connects one link session. */
  async connect(link: LinkConfig, runner: LinkRunner): Promise<void> {
    const { hostname, port } = splitHostPort(runner.address);
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
            compression: codecsFor(this.cfg.federation.compression),
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
  links(): LinkInfo[] {
    const now = Date.now();
    const out: LinkInfo[] = this.runners.map((l) => {
      const st = l.info();
      const parts = l.currentSession ? this.parts.get(l.currentSession) : undefined;
      if (parts) {
        st.unackedBatches = parts.forwarder?.unacked ?? 0;
        st.stored = parts.receiver.stats.stored;
        st.lanes = parts.forwarder?.laneStats?.() ?? [];
      }
      // From the durable cursors, so a link that is down still shows what waits for it
      // (before its first session, what its hold keeps).
      // A link with a hold has never had a session: another link's cursors on the same pattern are not its own.
      const hold = cursorName(holdPeer(l.config.hubs));
      const held = l.lastPeer === null && this.messenger.subscribers().some((s) => s.name === hold);
      const peer = l.lastPeer ?? (held ? null : this.linkCursorPeer(l.config));
      st.backlog = peer === null ? this.backlogOf(holdPeer(l.config.hubs), l.config.publish) : this.backlogOf(peer, l.config.publish);
      const aged = withAges(st.backlog, this.oldest, compilePriorities(l.config.publishLanes), now);
      st.laneBacklog = aged.lanes;
      return st;
    });
    for (const [s, p] of this.parts) {
      if (s.role !== "hub") continue;
      out.push({
        kind: s.hello?.mode === "ephemeral" ? "ephemeral" : "peer",
        target: s.peer.name,
        state: s.state === "open" ? "open" : "connecting",
        peer: s.peer.name,
        connectedSince: s.connectedAt,
        reconnects: 0,
        rttMs: s.rttMs ?? null,
        unackedBatches: p.forwarder?.unacked ?? 0,
        stored: p.receiver.stats.stored,
        ...(() => {
          const aged = withAges(p.forwarder?.backlog() ?? [], this.oldest, this.peers.get(s.peer.name)?.laneOf ?? (() => DEFAULT_PRIORITY), now);
          return { backlog: aged.backlog, laneBacklog: aged.lanes };
        })(),
        stalls: this.peerStalls.get(s.peer.name) ?? 0,
        lastError: null,
        compression: s.codec ?? null,
        wire: { ...s.wire },
        lanes: p.forwarder?.laneStats?.() ?? [],
        maxBytesPerS: this.peers.get(s.peer.name)?.cfg.maxBytesPerS ?? null,
      });
    }
    return out;
  }

  /**
   * Reads the publish time of the oldest unacknowledged message of every
   * backlog that is new since the last call: status and metrics call it
   * before they report ages.
   */
  async sampleHealth(): Promise<void> {
    const all = this.links().flatMap((l) => l.backlog);
    await this.oldest.sample(this.messenger, all);
  }

  /**
   * The fleet table (fleet.ts): hub peers (configured, connected, or with
   * cursors left from earlier sessions) and this instance's links. The
   * oldest-message ages are read from the log for backlogs not seen yet.
   */
  async fleet(now = Date.now()): Promise<FleetPeer[]> {
    const out: FleetPeer[] = [];
    const open = new Map<string, PeerSession>();
    for (const s of this.parts.keys()) if (s.role === "hub") open.set(s.peer.name, s);
    const linkPeers = new Set(this.runners.map((r) => r.lastPeer).filter((p): p is string => p !== null));
    // Cursors of peers: `_fed.<peer>` (not a link's hub, not a hold), with the patterns they read and when last used.
    const cursors = new Map<string, { patterns: string[]; touched: number }>();
    if (this.cfg.hub) {
      for (const sub of this.messenger.subscribers()) {
        if (!sub.name.startsWith("_fed.") || sub.name.startsWith("_fed..")) continue;
        const peer = sub.name.slice("_fed.".length);
        // A hub with links of its own: an unknown peer's cursor on a link's pattern is that link's hub.
        if (linkPeers.has(peer) || (!this.peers.has(peer) && !this.seen.has(peer) && this.cfg.links.some((l) => l.publish.includes(sub.pattern)))) continue;
        const c = cursors.get(peer) ?? { patterns: [], touched: 0 };
        c.patterns.push(sub.pattern);
        c.touched = Math.max(c.touched, sub.touched);
        cursors.set(peer, c);
      }
    }
    const names = new Set([...this.peers.keys(), ...open.keys(), ...this.seen.keys(), ...cursors.keys()]);
    const rows: { row: FleetPeer; backlog: ChannelBacklog[]; laneOf: (c: string) => number }[] = [];
    for (const name of names) {
      const s = open.get(name);
      const seen = this.seen.get(name);
      const c = cursors.get(name);
      const laneOf = this.peers.get(name)?.laneOf ?? (() => DEFAULT_PRIORITY);
      const backlog = s ? (this.parts.get(s)?.forwarder?.backlog() ?? []) : c ? this.backlogOf(name, c.patterns) : [];
      const lastSeen = s ? now : (seen?.lastSeenMs ?? (c && c.touched > 0 ? c.touched : null));
      rows.push({
        row: {
          kind: (s ? s.hello?.mode === "ephemeral" : seen?.ephemeral) ? "ephemeral" : "peer",
          name,
          state: s ? (s.state === "open" ? "open" : "connecting") : "offline",
          since: s ? s.connectedAt : lastSeen,
          lastSeen,
          rttMs: s?.rttMs ?? null,
          connects: seen?.connects ?? 0,
          backlogMessages: backlog.reduce((n, b) => n + b.messages, 0),
          backlogBytes: backlog.reduce((n, b) => n + b.bytes, 0),
          oldestAgeMs: null,
          certNotAfter: s ? s.peer.notAfter.getTime() : (seen?.certNotAfter ?? null),
          lastError: s ? null : (seen?.lastReason ?? null),
          configured: this.peers.has(name),
        },
        backlog,
        laneOf,
      });
    }
    for (const l of this.links()) {
      if (l.kind !== "link") continue;
      rows.push({
        row: {
          kind: "link",
          name: l.peer ?? l.target,
          state: l.state === "open" ? "open" : l.state,
          since: l.connectedSince,
          lastSeen: l.state === "open" ? now : null,
          rttMs: l.rttMs,
          connects: l.reconnects,
          backlogMessages: l.backlog.reduce((n, b) => n + b.messages, 0),
          backlogBytes: l.backlog.reduce((n, b) => n + b.bytes, 0),
          oldestAgeMs: null,
          certNotAfter: null,
          lastError: l.lastError,
          configured: true,
        },
        backlog: l.backlog,
        laneOf: () => DEFAULT_PRIORITY,
      });
    }
    await this.fleetOldest.sample(
      this.messenger,
      rows.flatMap((r) => r.backlog),
    );
    for (const r of rows) {
      const aged = withAges(r.backlog, this.fleetOldest, r.laneOf, now);
      for (const b of aged.backlog) if (b.oldestAgeMs != null) r.row.oldestAgeMs = Math.max(r.row.oldestAgeMs ?? 0, b.oldestAgeMs);
      out.push(r.row);
    }
    return out;
  }

  /** The audit trail's write health, when there is one. */
  auditHealth(): { failedWrites: number; droppedLines: number } | undefined {
    return this.audit ? { failedWrites: this.audit.failedWriteCount, droppedLines: this.audit.droppedLines } : undefined;
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
  /**
   * A configuration reload: hub peers and links as `next` has them.
   * Sessions of peers that were removed or whose rules changed are closed
   * (a changed peer reconnects and gets its new rules; until it does,
   * nothing outside them is taken or sent, the rules being read per
   * batch); links that were removed stop, new ones start, changed ones
   * start again. Everything else keeps running. Returns what changed.
   */
  reconfigure(next: Pick<FederationConfig, "hub" | "links">): string[] {
    const changes: string[] = [];
    const before = new Map([...this.peers].map(([name, p]) => [name, JSON.stringify(p.cfg)]));
    const after = new Map((next.hub?.peers ?? []).map((p) => [p.name, p]));
    const ended = new Set<string>();
    for (const [name, was] of before) {
      const now = after.get(name);
      if (!now) {
        this.peers.delete(name);
        ended.add(name);
        changes.push(`hub peer ${name} removed`);
      } else if (JSON.stringify(now) !== was) {
        this.peers.set(name, compilePeer(now));
        ended.add(name);
        changes.push(`hub peer ${name} changed`);
      }
    }
    for (const [name, p] of after) {
      if (before.has(name)) continue;
      this.peers.set(name, compilePeer(p));
      changes.push(`hub peer ${name} added`);
    }
    for (const [s, parts] of [...this.parts]) {
      if (s.role !== "hub" || !ended.has(s.peer.name)) continue;
      parts.receiver.flushAcks();
      s.close("reconfigured", this.peers.has(s.peer.name) ? "the hub's rules for this peer changed: reconnect" : "removed from hub.peers");
    }
    const key = (l: LinkConfig) => l.hubs.join(",");
    const wanted = new Map(next.links.map((l) => [key(l), l]));
    for (const r of [...this.runners]) {
      const want = wanted.get(key(r.config));
      if (want && JSON.stringify(want) === JSON.stringify(r.config)) continue;
      this.stopRunner(r, want ? "the link's configuration changed" : "link removed from the configuration");
      changes.push(`link to ${key(r.config)} ${want ? "changed" : "removed"}`);
    }
    for (const l of next.links) {
      if (this.runners.some((r) => key(r.config) === key(l))) continue;
      if (!changes.includes(`link to ${key(l)} changed`)) changes.push(`link to ${key(l)} added`);
      const runner = new LinkRunner(this, l);
      this.runners.push(runner);
      if (!this.stopped) void runner.run();
    }
    this.cfg = { ...this.cfg, hub: this.cfg.hub && next.hub ? { ...this.cfg.hub, peers: next.hub.peers } : this.cfg.hub, links: next.links };
    this.holdNeverConnected();
    return changes;
  }

  /** The audit trail's latest events (none without an audit trail). */
  recentAudit(): readonly Record<string, unknown>[] {
    return this.audit?.recent() ?? [];
  }

  /** Appends an event to the audit trail, when there is one. */
  auditRecord(event: AuditEvent, fields: Record<string, string>): void {
    this.audit?.record(event, fields);
  }

  private stopRunner(r: LinkRunner, why: string): void {
    const s = r.currentSession;
    r.stop();
    if (s) {
      this.parts.get(s)?.receiver.flushAcks();
      s.close("shutdown", why);
    }
    this.runners.splice(this.runners.indexOf(r), 1);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.messenger.foreignReply = undefined;
    this.messenger.routeDown = undefined;
    if (this.cleanupTimer) clearInterval(this.cleanupTimer);
    for (const l of this.runners) l.stop();
    for (const [s, parts] of [...this.parts]) {
      parts.receiver.flushAcks(); // so that the peer need not send those batches again
      s.close("shutdown", "agent stopping");
    }
    this.server?.stop(true);
    await this.audit?.flush();
    this.audit?.close();
  }
}

function compilePeer(p: PeerConfig): { cfg: PeerConfig; publish: Matcher; subscribe: Matcher; laneOf: (channel: string) => number } {
  return { cfg: p, publish: compileRules(p.publish), subscribe: compileRules(p.subscribe), laneOf: compilePriorities(p.subscribeLanes) };
}
