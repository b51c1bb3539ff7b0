/**
 * One configured link of a device: dials its hub, runs the session, and
 * dials again with backoff when it ends (the pacing is the Redialer's),
 * taking the hubs of its list in turn.
 */
import type { LinkConfig } from "../config/schema.ts";
import type { LinkInfo } from "./link.ts";
import { type AttemptControl, type AttemptEnd, Redialer } from "./redial.ts";
import type { PeerSession } from "./session.ts";

/** What a link runner needs of the federation that owns it. */
export interface LinkDialer {
  readonly backoff: { reconnectBaseMs: number; reconnectMaxMs: number; reconnectJitter: number };
  readonly isStopped: boolean;
  /** Dials the link's hub; the session's events come back through `opened` and `closed`. */
  connect(link: LinkConfig, runner: LinkRunner): Promise<void>;
}

/** One configured link: connects, and reconnects with backoff when the session ends. */
export class LinkRunner {
  private readonly fed: LinkDialer;
  private readonly link: LinkConfig;
  /** Name (CN) of the hub at the last session: whose cursors hold this link's backlog. */
  lastPeer: string | null = null;
  /** Sessions the stall watchdog ended. */
  stalls = 0;
  private session: PeerSession | null = null;
  private state: LinkInfo["state"] = "connecting";
  private lastError: string | null = null;
  private readonly redialer: Redialer;
  private readonly stopping = new AbortController();
  /** Attempts made so far: the next one dials `hubs[attempts % hubs.length]`. */
  private attempts = 0;
  /** The hub address of the attempt running now (or of the last one). */
  address: string;
  /** The attempt running now: how it learns its session opened, and how it is ended. */
  private attempt: { ctl: AttemptControl; end: (reason: string) => void } | null = null;

  constructor(fed: LinkDialer, link: LinkConfig) {
    this.fed = fed;
    this.link = link;
    this.address = link.hubs[0]!;
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
          // Each attempt takes the next hub of the list: after a hub of a tier fails (or its session
          // ends), the link fails over to the next one instead of waiting for that one to come back.
          this.address = this.link.hubs[this.attempts++ % this.link.hubs.length]!;
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

  /** The link as status and metrics show it (what its sessions carried is added by the caller). */
  info(): LinkInfo {
    const s = this.session;
    return {
      kind: "link",
      target: this.address,
      state: this.state,
      peer: s?.peer.name ?? null,
      connectedSince: s && this.state === "open" ? s.connectedAt : null,
      reconnects: this.redialer.reconnects,
      rttMs: s?.rttMs ?? null,
      unackedBatches: 0,
      stored: 0,
      backlog: [],
      lastError: this.lastError,
      compression: s && this.state === "open" ? (s.codec ?? null) : null,
      wire: s && this.state === "open" ? { ...s.wire } : null,
      lanes: [],
      maxBytesPerS: this.link.maxBytesPerS ?? null,
      laneBacklog: [],
      stalls: this.stalls,
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
