/**
 * A durable subscriber consumed from outside the process (HTTP pull, NDJSON,
 * SSE and WebSocket streams, the CLI): no handler, the consumer fetches and
 * acks. Fetching never moves the cursor; only `ack` does (cumulatively), so
 * whatever a consumer did not ack comes again on its next pull or stream.
 */
import { scanEnvelope, type EnvelopeView } from "../envelope/scan.ts";
import { decodeEnvelope, type Message } from "../envelope/envelope.ts";
import { InvalidArgumentError, UnknownChannelError } from "../errors.ts";
import type { Logger } from "../observability/logger.ts";
import type { ChannelLog } from "../store/channel-log.ts";
import type { RawRecord } from "../store/record.ts";
import type { CursorState, CursorStore } from "../store/cursor-store.ts";

/** What a durable subscriber needs from its messenger. */
export interface DurableSubscriberHost {
  readonly cursors: CursorStore;
  readonly logger: Logger;
  /** Logs of the channels the pattern matches now. */
  matchingLogs(pattern: string): ChannelLog[];
  /** The log of `channel`, if it exists. */
  log(channel: string): ChannelLog | undefined;
  /** Subscribes to "a matching channel was created"; returns the remover. */
  onMatchingChannel(pattern: string, fn: () => void): () => void;
  noteSent(channel: string, count: number, redelivered: number): void;
  noteAcked(channel: string, count: number): void;
  /** Messages that had expired when this subscriber came to them, each counted once. */
  noteExpired(channel: string, count: number): void;
  /** A consumer started (+1) or stopped (-1) watching the pattern: someone is there to answer a request. */
  noteWatching?(pattern: string, delta: number): void;
}

/** Per-channel positions: the next seq to read on each channel. */
export type Positions = Map<string, number>;

/** Options of `fetch`. */
export interface FetchOptions {
  max: number;
  /** Stop adding messages past about this many body bytes (at least one is returned). */
  maxBytes?: number;
  /** Where to read from per channel; the acked cursors when omitted. */
  after?: Positions;
}

/** A stored envelope as a forwarder sends it: its bytes unchanged, and where its route sits in them. */
export interface StoredEnvelope {
  seq: number;
  channel: string;
  view: EnvelopeView;
  body: Uint8Array;
}

/** Takes the records of a fetch, one by one (`add`: false for one that expired). */
interface Push {
  add(body: Uint8Array, seq: number, channel: string): boolean;
}

/** A fetch's records as stored, with their envelopes scanned, not decoded (decoding whole envelopes was most of a forwarder's CPU). */
class RawPush implements Push {
  private readonly now = Date.now();
  constructor(private readonly out: StoredEnvelope[]) {}

  add(body: Uint8Array, seq: number, channel: string): boolean {
    const view = scanEnvelope(body);
    if (view.expires > 0 && view.expires <= this.now) return false;
    this.out.push({ seq, channel, view, body });
    return true;
  }
}

/** A fetch's records decoded into messages. */
class DecodedPush implements Push {
  private readonly now = Date.now();
  constructor(private readonly out: Message[]) {}

  add(body: Uint8Array, seq: number): boolean {
    const m = decodeEnvelope(body, seq);
    if (m.expires !== undefined && m.expires <= this.now) return false;
    this.out.push(m);
    return true;
  }
}

/** Where a fetch is: the channels in the order it takes them, the next one, and what it took. */
interface Gathering {
  logs: ChannelLog[];
  start: number;
  k: number;
  count: number;
  bytes: number;
  maxBytes: number;
}

/** One channel's read: from where, and its acked cursor when the fetch came to it. */
interface ReadAt {
  log: ChannelLog;
  from: number;
  acked: number;
}

/** A handle on one durable subscriber (pattern + name). */
export class DurableSubscriber {
  readonly pattern: string;
  readonly name: string;
  private readonly host: DurableSubscriberHost;
  private readonly state: CursorState;
  /** Highest seq ever handed out per channel, to count redeliveries. */
  private readonly highWater = new Map<string, number>();
  /**
   * Replaced, never changed in place: an ack calls the list as it was, even
   * when a listener removes itself, with no copy made per ack.
   */
  private ackListeners: readonly ((channel: string, cursor: number) => void)[] = [];
  private rotate = 0;

  /** @internal Made by `Messenger.openSubscriber`. */
  constructor(host: DurableSubscriberHost, state: CursorState) {
    this.host = host;
    this.state = state;
    this.pattern = state.pattern;
    this.name = state.name;
  }

  /** Marks the subscriber alive at `now` (its consumer connected). */
  touch(now = Date.now()): void {
    this.host.cursors.touch(this.state, now);
  }

  /** The acked position (next seq to deliver) on `channel`; undefined for a channel that does not exist. */
  cursorOf(channel: string): number | undefined {
    const log = this.host.log(channel);
    return log ? this.cursor(log) : undefined;
  }

  /** The seq the next record of `channel` will get; undefined for a channel that does not exist. */
  nextSeqOf(channel: string): number | undefined {
    return this.host.log(channel)?.nextSeq;
  }

  /** The acked position (next seq to deliver) on the channel of `log`. */
  private cursor(log: ChannelLog): number {
    const c = this.state.cursors[log.name];
    if (c === undefined) {
      const from = this.state.from;
      const start = typeof from === "number" ? Math.max(from, log.firstSeq) : log.firstSeq;
      this.host.cursors.set(this.state, log.name, start);
      return start;
    }
    if (c < log.firstSeq) {
      const lost = log.firstSeq - c;
      this.host.cursors.addSkipped(this.state, log.name, lost);
      this.host.cursors.set(this.state, log.name, log.firstSeq);
      this.host.logger.warn("retention removed messages before this subscriber read them", { subscriber: this.name, channel: log.name, skipped: lost });
      return log.firstSeq;
    }
    if (c > log.nextSeq) {
      this.host.cursors.set(this.state, log.name, log.nextSeq);
      return log.nextSeq;
    }
    return c;
  }

  /** How many channels match now: a fetch returns at most one run of each. */
  channelCount(): number {
    return this.host.matchingLogs(this.pattern).length;
  }

  /**
   * Whether a matching channel has a record at or past `after` (default:
   * the acked cursors) and the acked cursor: whether a fetch would read
   * anything now.
   */
  hasAfter(after?: Positions): boolean {
    for (const log of this.host.matchingLogs(this.pattern)) if (log.nextSeq > Math.max(after?.get(log.name) ?? 0, this.cursor(log))) return true;
    return false;
  }

  /** The acked positions on every matching channel. */
  positions(): Positions {
    const p: Positions = new Map();
    for (const log of this.host.matchingLogs(this.pattern)) p.set(log.name, this.cursor(log));
    return p;
  }

  /** Messages stored after the acked cursor on every matching channel. */
  lag(): number {
    let n = 0;
    for (const log of this.host.matchingLogs(this.pattern)) n += log.nextSeq - this.cursor(log);
    return n;
  }

  /**
   * Like `fetch`, but also hands back each record's stored bytes, for
   * forwarding a record as it is stored (federation).
   */
  async fetchRaw(opts: FetchOptions): Promise<StoredEnvelope[]> {
    const out: StoredEnvelope[] = [];
    await this.collect(opts, new RawPush(out));
    return out;
  }

  /**
   * `fetchRaw` without waiting, for a reader that keeps up with the log:
   * null when nothing was taken and the next records must come from disk
   * (then `fetchRaw`).
   */
  fetchRawNow(opts: FetchOptions): StoredEnvelope[] | null {
    const out: StoredEnvelope[] = [];
    return this.collectNow(opts, new RawPush(out)) || out.length > 0 ? out : null;
  }

  /**
   * Up to `max` messages after `after` (default: the acked cursors), taking
   * channels in turn so that one busy channel does not starve the others.
   * Updates `after` in place past what it returns.
   */
  async fetch(opts: FetchOptions): Promise<Message[]> {
    const out: Message[] = [];
    await this.collect(opts, new DecodedPush(out));
    return out;
  }

  /** `fetch` without waiting: null when nothing was taken and the next records must come from disk. */
  fetchNow(opts: FetchOptions): Message[] | null {
    const out: Message[] = [];
    return this.collectNow(opts, new DecodedPush(out)) || out.length > 0 ? out : null;
  }

  /**
   * Reads records after the positions, handing each to `push`, which
   * returns false for one that expired: it is counted once (the first time
   * this subscriber passes it) and not delivered. Expired records right
   * after the acked cursor, with nothing before them still out, are acked
   * at once, so that they neither count as lag nor pin retention.
   */
  private async collect(opts: FetchOptions, push: Push): Promise<void> {
    const g = this.gathering(opts);
    if (!g) return;
    for (let at = this.gatherNow(g, opts, push); at; at = this.gatherNow(g, opts, push)) {
      const recs = await at.log.read(at.from, opts.max - g.count, g.maxBytes - g.bytes);
      this.take(g, opts, push, at, recs);
    }
  }

  /** `collect` from memory only: false when it stopped at a channel whose next records are on disk. */
  private collectNow(opts: FetchOptions, push: Push): boolean {
    const g = this.gathering(opts);
    return !g || this.gatherNow(g, opts, push) === null;
  }

  /** A fetch's running totals; null when there is nothing to read from. */
  private gathering(opts: FetchOptions): Gathering | null {
    const logs = this.host.matchingLogs(this.pattern);
    if (logs.length === 0 || opts.max <= 0) return null;
    return { logs, start: this.rotate++ % logs.length, k: 0, count: 0, bytes: 0, maxBytes: opts.maxBytes ?? 4 * 1024 * 1024 };
  }

  /**
   * Takes the channels in turn from where `g` is, as far as their records
   * are in memory; returns the channel it stopped at when one must be read
   * from disk (the caller reads it and hands the records to `take`), else null.
   */
  private gatherNow(g: Gathering, opts: FetchOptions, push: Push): ReadAt | null {
    for (; g.k < g.logs.length && g.count < opts.max && g.bytes < g.maxBytes; g.k++) {
      const log = g.logs[(g.start + g.k) % g.logs.length]!;
      const acked = this.cursor(log);
      const from = Math.max(opts.after?.get(log.name) ?? acked, acked, log.firstSeq);
      if (from >= log.nextSeq) continue;
      const recs = log.readNow(from, opts.max - g.count, g.maxBytes - g.bytes);
      const at = { log, from, acked };
      if (recs === null) {
        g.k++;
        return at;
      }
      this.take(g, opts, push, at, recs);
    }
    return null;
  }

  /** Hands one channel's records to `push` and moves the positions and counts past them. */
  private take(g: Gathering, opts: FetchOptions, push: Push, at: ReadAt, recs: RawRecord[]): void {
    const { log, from, acked } = at;
    let redelivered = 0;
    let expired = 0;
    let sent = 0;
    // The last of the expired records right after the cursor (from - 1: none), while `leading`.
    let expiredPrefix = from - 1;
    let leading = from === acked;
    const hw = this.highWater.get(log.name) ?? 0;
    for (const r of recs) {
      try {
        if (!push.add(r.body, r.seq, log.name)) {
          if (r.seq > hw) expired++;
          if (leading && expiredPrefix === r.seq - 1) expiredPrefix = r.seq;
          continue;
        }
        g.count++;
        sent++;
      } catch (err) {
        this.host.logger.error("record is not an envelope, skipped", { channel: log.name, seq: r.seq, error: String(err) });
        continue;
      }
      leading = false;
      g.bytes += r.body.length;
      if (r.seq <= hw) redelivered++;
    }
    if (recs.length > 0) {
      const last = recs[recs.length - 1]!.seq;
      opts.after?.set(log.name, last + 1);
      if (last > hw) this.highWater.set(log.name, last);
      if (sent > 0) this.host.noteSent(log.name, sent, redelivered);
      if (expired > 0) this.host.noteExpired(log.name, expired);
      if (expiredPrefix >= from && from === acked) this.ack(log.name, expiredPrefix);
    }
  }

  /**
   * Cumulative ack: everything up to and including `seq` on `channel` is
   * done. Never moves the cursor back; a seq past the end is refused, as is
   * a channel that does not exist (`UnknownChannelError`). Returns the new
   * cursor.
   */
  ack(channel: string, seq: number): number {
    const log = this.host.log(channel);
    if (!log) throw new UnknownChannelError(channel);
    if (!Number.isInteger(seq) || seq < 0) throw new InvalidArgumentError("seq must be a non-negative integer");
    if (seq >= log.nextSeq) throw new InvalidArgumentError(`seq ${seq} is past the end of channel ${log.name} (next seq ${log.nextSeq})`);
    const cur = this.cursor(log);
    if (seq + 1 > cur) {
      this.host.cursors.set(this.state, log.name, seq + 1);
      this.host.noteAcked(log.name, seq + 1 - cur);
      const listeners = this.ackListeners;
      for (let i = 0; i < listeners.length; i++) listeners[i]!(log.name, seq + 1);
    }
    return Math.max(cur, seq + 1);
  }

  /**
   * Calls `fn` with the channel and the new cursor whenever an ack moves
   * this subscriber's cursor, from whichever consumer it came (a stream's
   * client may ack by HTTP); returns the remover.
   */
  onAck(fn: (channel: string, cursor: number) => void): () => void {
    if (!this.ackListeners.includes(fn)) this.ackListeners = [...this.ackListeners, fn];
    return () => {
      this.ackListeners = this.ackListeners.filter((l) => l !== fn);
    };
  }

  /**
   * Calls `onChange` after every commit to a matching channel and when a
   * matching channel is created, until the returned function is called. For
   * a long-lived reader (a federation forwarder) that would otherwise set up
   * and tear down a `wait` with its timer and listeners for every record.
   */
  watch(onChange: () => void): () => void {
    const offs = new Map<string, () => void>();
    const attach = () => {
      for (const log of this.host.matchingLogs(this.pattern))
        if (!offs.has(log.name))
          offs.set(
            log.name,
            log.onCommit(() => onChange()),
          );
    };
    attach();
    const offNew = this.host.onMatchingChannel(this.pattern, () => {
      attach();
      onChange();
    });
    this.host.noteWatching?.(this.pattern, 1);
    let watching = true;
    return () => {
      if (watching) this.host.noteWatching?.(this.pattern, -1);
      watching = false;
      offNew();
      for (const off of offs.values()) off();
      offs.clear();
    };
  }

  /**
   * Resolves true as soon as a matching channel has a record at or past
   * `after` (default: the acked cursors) or a matching channel is created;
   * false after `timeoutMs` or on `signal`.
   */
  wait(timeoutMs: number, opts: { after?: Positions; signal?: AbortSignal } = {}): Promise<boolean> {
    const ready = () => this.hasAfter(opts.after);
    if (ready()) return Promise.resolve(true);
    if (timeoutMs <= 0 || opts.signal?.aborted) return Promise.resolve(false);
    return new Promise<boolean>((resolve) => {
      const offs: (() => void)[] = [];
      const finish = (v: boolean) => {
        clearTimeout(timer);
        for (const off of offs) off();
        resolve(v);
      };
      const timer = setTimeout(() => finish(false), timeoutMs);
      for (const log of this.host.matchingLogs(this.pattern)) offs.push(log.onCommit(() => ready() && finish(true)));
      offs.push(this.host.onMatchingChannel(this.pattern, () => finish(true)));
      if (opts.signal) {
        const onAbort = () => finish(false);
        opts.signal.addEventListener("abort", onAbort, { once: true });
        offs.push(() => opts.signal!.removeEventListener("abort", onAbort));
      }
    });
  }
}
