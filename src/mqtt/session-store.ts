/**
 * What keyop keeps about persistent MQTT sessions besides their durable
 * subscribers (`mqtt.<client id>`), in `<data_dir>/mqtt-sessions/sessions.json`:
 *
 * - Sent marks: per client id and channel, the highest seq sent. A QoS 1
 *   message sent again must carry DUP (MQTT: "MUST be set to 1 when it
 *   attempts to re-deliver"), and one sent for the first time must not,
 *   also across a keyop restart.
 * - Expiry: how long each session outlives its connection, and until when
 *   a disconnected one lives. An abandoned client id would otherwise pin
 *   its channels' retention forever, as an abandoned federation peer would
 *   without `federation.peer_expiry`.
 *
 * Saved at once when a session connects or goes, every second while marks
 * change, and at a clean stop (then marked clean). After a crash the marks
 * may lag behind what went out, so every message already in the log when
 * keyop started counts as maybe sent (DUP set): the rule leans to "maybe
 * again", which a receiver handles, rather than hiding a redelivery.
 * Sessions that were connected when keyop stopped start their expiry at
 * the next start.
 */
import { mkdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { writeFileAtomic } from "../store/fsync-dir.ts";
import type { Logger } from "../observability/logger.ts";

const FILE = "sessions.json";
const SAVE_EVERY_MS = 1000;

/** One persistent session's lifetime. */
interface Lifetime {
  /** How long it outlives its connection, ms (null: never expires). */
  expiryMs: number | null;
  /** Disconnected: when it expires (null: never). Connected: null. */
  until: number | null;
  connected: boolean;
}

/** A persistent session's subscription as the client made it (its durable subscriber holds the cursor). */
export interface KeptSubscription {
  filter: string;
  options: { qos: 0 | 1 | 2; noLocal: boolean; retainAsPublished: boolean; id: number };
}

interface Saved {
  clean: boolean;
  marks: Record<string, Record<string, number>>;
  sessions?: Record<string, Lifetime>;
  /** Per client id and keyop pattern, the MQTT filter and options it was subscribed with. */
  subscriptions?: Record<string, Record<string, KeptSubscription>>;
  /** Per client id, packet ids of QoS 2 messages the client has received (PUBREC) and not completed (PUBCOMP). */
  releases?: Record<string, number[]>;
}

/** Sent marks and expiry of the persistent MQTT sessions of one data directory. */
export class SessionStore {
  private readonly dir: string;
  private readonly byClient = new Map<string, Map<string, number>>();
  private readonly lifetimes = new Map<string, Lifetime>();
  private readonly releases = new Map<string, Set<number>>();
  private readonly subs = new Map<string, Map<string, KeptSubscription>>();
  /** Set after a crash: per channel, the last seq in the log when keyop started. */
  private readonly crashFloor: ((channel: string) => number) | null;
  private dirty = false;
  private failedSaves = 0;
  private lastError: string | null = null;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private saving: Promise<void> = Promise.resolve();

  private readonly logger: Logger | undefined;

  private constructor(dir: string, crashFloor: ((channel: string) => number) | null, logger: Logger | undefined) {
    this.dir = dir;
    this.crashFloor = crashFloor;
    this.logger = logger;
  }

  /**
   * Loads what is kept under `dir`. `lastSeqAtStart` holds the last seq
   * stored in each channel now, before any client is served; it is used
   * when the previous run did not stop cleanly.
   */
  static async open(dir: string, lastSeqAtStart: ReadonlyMap<string, number>, logger?: Logger, now = Date.now()): Promise<SessionStore> {
    await mkdir(dir, { recursive: true });
    let saved: Saved | null = null;
    let existed = false;
    try {
      saved = JSON.parse(await readFile(join(dir, FILE), "utf8")) as Saved;
      existed = true;
    } catch (err) {
      existed = (err as NodeJS.ErrnoException).code !== "ENOENT";
    }
    // No file at all: no persistent session was ever served here. A file that is unreadable or
    // not marked clean: the run before did not end cleanly.
    const crashed = existed && saved?.clean !== true;
    if (crashed) logger?.warn("mqtt session state not saved cleanly (keyop stopped abruptly): messages stored before this start are sent with DUP", { file: join(dir, FILE) });
    const s = new SessionStore(dir, crashed ? (channel) => lastSeqAtStart.get(channel) ?? 0 : null, logger);
    for (const [client, chans] of Object.entries(saved?.marks ?? {})) {
      s.byClient.set(client, new Map(Object.entries(chans).filter(([, n]) => Number.isSafeInteger(n))));
    }
    for (const [client, l] of Object.entries(saved?.sessions ?? {})) {
      const expiryMs = typeof l?.expiryMs === "number" && l.expiryMs >= 0 ? l.expiryMs : null;
      // Connected when keyop stopped: the connection ended with that run.
      const until = l?.connected ? (expiryMs === null ? null : now + expiryMs) : typeof l?.until === "number" ? l.until : null;
      s.lifetimes.set(client, { expiryMs, until, connected: false });
    }
    for (const [client, kept] of Object.entries(saved?.subscriptions ?? {})) {
      if (kept && typeof kept === "object") s.subs.set(client, new Map(Object.entries(kept).filter(([, k]) => typeof k?.filter === "string" && typeof k.options?.qos === "number")));
    }
    for (const [client, ids] of Object.entries(saved?.releases ?? {})) {
      if (Array.isArray(ids)) s.releases.set(client, new Set(ids.filter((n) => Number.isInteger(n) && n >= 1 && n <= 65_535)));
    }
    // From now on the file on disk is not clean until the next clean close.
    await s.save(false);
    return s;
  }

  /** Whether `seq` of `channel` may have been sent to `client` before (the DUP flag). */
  sentBefore(client: string, channel: string, seq: number): boolean {
    if ((this.byClient.get(client)?.get(channel) ?? 0) >= seq) return true;
    return this.crashFloor !== null && seq <= this.crashFloor(channel);
  }

  /** Notes that `seq` of `channel` goes to `client` now. */
  sending(client: string, channel: string, seq: number): void {
    let chans = this.byClient.get(client);
    if (!chans) {
      chans = new Map();
      this.byClient.set(client, chans);
    }
    if ((chans.get(channel) ?? 0) < seq) {
      chans.set(channel, seq);
      this.markDirty();
    }
  }

  /**
   * The client received QoS 2 message `id` (PUBREC): until PUBCOMP the
   * session owes it a PUBREL, also after a reconnect or a restart. Saved at
   * once, as the cursor moved past the message.
   */
  releasing(client: string, id: number): Promise<void> {
    let ids = this.releases.get(client);
    if (!ids) {
      ids = new Set();
      this.releases.set(client, ids);
    }
    ids.add(id);
    return this.save(false);
  }

  /** A persistent session subscribed (or subscribed again, with other options). */
  remember(client: string, pattern: string, filter: string, options: KeptSubscription["options"]): void {
    let m = this.subs.get(client);
    if (!m) {
      m = new Map();
      this.subs.set(client, m);
    }
    const was = m.get(pattern);
    if (was && was.filter === filter && JSON.stringify(was.options) === JSON.stringify(options)) return;
    m.set(pattern, { filter, options: { ...options } });
    this.markDirty();
  }

  /** A persistent session unsubscribed. */
  forget(client: string, pattern: string): void {
    const m = this.subs.get(client);
    if (!m?.delete(pattern)) return;
    if (m.size === 0) this.subs.delete(client);
    this.markDirty();
  }

  /** Every subscription kept for `client`, by key (a pattern, or `$share/<group>\u0000<pattern>`). */
  rememberedAll(client: string): [string, KeptSubscription][] {
    return [...(this.subs.get(client) ?? [])];
  }

  /** Every kept subscription of every client, as [client id, key]. */
  allRemembered(): [string, string][] {
    return [...this.subs].flatMap(([client, m]) => [...m.keys()].map((key): [string, string] => [client, key]));
  }

  /** How a persistent session subscribed to `pattern`, if known. */
  remembered(client: string, pattern: string): KeptSubscription | undefined {
    return this.subs.get(client)?.get(pattern);
  }

  /** PUBCOMP for `id`: nothing more is owed for it. */
  released(client: string, id: number): void {
    const ids = this.releases.get(client);
    if (!ids?.delete(id)) return;
    if (ids.size === 0) this.releases.delete(client);
    this.markDirty();
  }

  /** Packet ids the session of `client` owes a PUBREL. */
  pendingReleases(client: string): number[] {
    return [...(this.releases.get(client) ?? [])];
  }

  /** A persistent session is connected; it lives `expiryMs` after its connection (null: forever). */
  connected(client: string, expiryMs: number | null): Promise<void> {
    this.lifetimes.set(client, { expiryMs, until: null, connected: true });
    return this.save(false);
  }

  /** A persistent session's connection ended `now`: its expiry starts. */
  disconnected(client: string, expiryMs: number | null, now = Date.now()): Promise<void> {
    this.lifetimes.set(client, { expiryMs, until: expiryMs === null ? null : now + expiryMs, connected: false });
    return this.save(false);
  }

  /** Whether keyop knows the client id's session lifetime. */
  knows(client: string): boolean {
    return this.lifetimes.has(client);
  }

  /** Client ids whose sessions have expired by `now` (none of them connected). */
  expired(now = Date.now()): string[] {
    return [...this.lifetimes].filter(([, l]) => !l.connected && l.until !== null && l.until <= now).map(([c]) => c);
  }

  /** Forgets a client id altogether (its session ended or expired). */
  drop(client: string): Promise<void> {
    const had = [this.byClient.delete(client), this.releases.delete(client), this.subs.delete(client)].some(Boolean);
    if (!this.lifetimes.delete(client) && !had) return Promise.resolve();
    return this.save(false);
  }

  /**
   * Something changed: one save `SAVE_EVERY_MS` from now takes it (and all
   * that changes meanwhile). Nothing changed, no timer: an idle agent does
   * not wake for this.
   */
  private markDirty(): void {
    this.dirty = true;
    if (this.timer !== null || this.closed) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      // save() logs and counts its own failure and marks the state dirty again, which arms the retry.
      if (this.dirty) void this.save(false).catch(() => undefined);
    }, SAVE_EVERY_MS);
    this.timer.unref?.();
  }

  private closed = false;

  /** Saves everything and marks the file clean: the next start knows the marks exactly. */
  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    await this.save(true);
  }

  /** A save waiting for the one before it: whatever changes meanwhile goes in it too. */
  private queued: Promise<void> | null = null;

  /**
   * Writes the state (temp file, fdatasync, rename, directory fsync) after
   * the save in progress. A burst of connects and disconnects (a fleet
   * coming back after an outage) shares one write: the state is taken when
   * the write starts, and a save not yet started is reused.
   */
  private save(clean: boolean): Promise<void> {
    this.dirty = false;
    if (this.queued && !clean) return this.queued;
    const task = this.saving.then(async () => {
      this.queued = null;
      const body: Saved = { clean, marks: {}, sessions: Object.fromEntries(this.lifetimes) };
      if (this.subs.size > 0) body.subscriptions = Object.fromEntries([...this.subs].map(([c, m]) => [c, Object.fromEntries(m)]));
      if (this.releases.size > 0) body.releases = Object.fromEntries([...this.releases].map(([c, ids]) => [c, [...ids]]));
      for (const [client, chans] of this.byClient) body.marks[client] = Object.fromEntries(chans);
      await writeFileAtomic(join(this.dir, FILE), JSON.stringify(body), this.dir);
    });
    this.queued = task;
    // Logged and counted here once; callers that do not wait for it ignore the rejection.
    this.saving = task.catch((err) => {
      this.markDirty(); // tried again in SAVE_EVERY_MS
      this.failedSaves++;
      this.lastError = String(err);
      this.logger?.error("mqtt session state not saved", { file: join(this.dir, FILE), error: String(err), failed_saves: this.failedSaves });
    });
    return task;
  }

  /** Saves that failed since open, and whether changes wait to be saved. */
  health(): { failedSaves: number; pending: boolean; lastError: string | null } {
    return { failedSaves: this.failedSaves, pending: this.dirty, lastError: this.lastError };
  }
}
