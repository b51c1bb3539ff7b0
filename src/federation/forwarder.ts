/**
 * Store and forward, sending side: for one session, reads the local log
 * through durable cursors (one subscriber `_fed.<peer>` per pattern, so the
 * position survives restarts and pins retention), sends BATCH frames of
 * stored records as they are stored, keeps at most `window` unacknowledged,
 * and moves the persisted cursor only when the peer's ACK arrives.
 */
import { envelopeReplyTo, routeIncludes, utf8Bytes } from "../envelope/scan.ts";
import type { Messenger } from "../messenger/messenger.ts";
import { CursorReader, type Delivery, STORED } from "../messenger/cursor-reader.ts";
import type { DurableSubscriber, StoredEnvelope } from "../messenger/durable-subscriber.ts";
import { Window } from "../messenger/window.ts";
import type { Logger } from "../observability/logger.ts";
import { LaneScheduler, type LaneStats } from "./lanes.ts";
import type { ChannelBacklog, Link } from "./link.ts";
import { batchFrame, batchFrameOf, type Ack } from "./messages.ts";
import { DEFAULT_PRIORITY } from "./priority.ts";
import { TokenBucket } from "./token-bucket.ts";

/** How a forwarder runs. */
export interface ForwarderOptions {
  messenger: Messenger;
  session: Link;
  /** Local channels to send. */
  patterns: string[];
  /** Only channels this accepts are sent (the hub's subscribe rules for the peer). */
  allow?: (channel: string) => boolean;
  /** Where a new cursor starts. */
  start: "latest" | "earliest";
  /** BATCH frames in flight, over all patterns. */
  window: number;
  maxBatchBytes: number;
  logger: Logger;
  /**
   * Cursors in memory only, from the latest message, dropped when the
   * forwarder stops: for ephemeral peers (live messages, no replay, no hub
   * cursor file, nothing pinned in retention).
   */
  volatile?: boolean;
  /** The lane of a channel's batches (priority.ts); one lane when absent. */
  laneOf?: (channel: string) => number;
  /** Cap on the wire bytes of data sent per second; none when absent. */
  maxBytesPerS?: number | undefined;
  /**
   * The stall watchdog: with batches in flight and neither an ACK nor a
   * drain of the connection for this long, the session is closed (code
   * `stalled`) so the link reconnects. 0 or absent: off.
   */
  stallMs?: number;
  /** Called when the watchdog ends the session. */
  onStall?: () => void;
  /** Told of each request sent (a record with reply_to): its inbox and when it expires. */
  onRequest?: (inbox: string, expires: number) => void;
}

/**
 * How much a batch holds under a bandwidth cap: half a second at the cap
 * (at least 4 KiB), so that a higher lane waits at most about that long
 * behind a batch already going out.
 */
export function cappedBatchBytes(maxBatchBytes: number, maxBytesPerS: number | undefined): number {
  if (maxBytesPerS === undefined) return maxBatchBytes;
  return Math.min(maxBatchBytes, Math.max(4096, Math.floor(maxBytesPerS / 2)));
}

/** Per channel, what the durable cursors `subs` have not acknowledged (channels `allow` accepts). */
export function backlogOf(messenger: Messenger, subs: DurableSubscriber[], allow?: (channel: string) => boolean): ChannelBacklog[] {
  const out = new Map<string, ChannelBacklog>();
  for (const sub of subs) {
    for (const [channel, cursor] of sub.positions()) {
      const log = messenger.channelLog(channel);
      if (!log || (allow && !allow(channel))) continue;
      const acc = out.get(channel) ?? { channel, from: cursor, messages: 0, bytes: 0 };
      acc.from = Math.min(acc.from, cursor);
      acc.messages += Math.max(0, log.nextSeq - cursor);
      acc.bytes += log.bytesFrom(cursor);
      out.set(channel, acc);
    }
  }
  return [...out.values()].sort((a, b) => a.channel.localeCompare(b.channel));
}

/** Name of the durable subscriber that holds what `peer` has acknowledged. */
export function cursorName(peer: string): string {
  return `_fed.${peer}`;
}

/**
 * The peer part of the cursors that hold a link's backlog until its first
 * session says which hub it is (its cursors are named by the hub's
 * certificate): from the link's hub addresses, so the same link finds them
 * after a restart.
 */
export function holdPeer(hubs: readonly string[]): string {
  return `.hold-${Bun.hash(hubs.join(",")).toString(16)}`;
}

/**
 * The sending half of a session, as the federation runs it: a Forwarder
 * over this instance's log, or a hub tier's reader of JetStream streams.
 */
export interface Sender {
  /** Runs until `stop()` or the session closes. */
  run(): Promise<void>;
  /** An ACK from the peer. */
  onAck(ack: Ack): void;
  /** Batches sent and not yet acknowledged. */
  readonly unacked: number;
  /** What the peer has not acknowledged, per channel (or pattern). */
  backlog(): ChannelBacklog[];
  /** Per lane, what waits to go and what went (none for a sender without lanes). */
  laneStats?(): LaneStats[];
  stop(): void;
}

interface InFlight {
  reader: CursorReader<StoredEnvelope>;
  delivery: Delivery<StoredEnvelope>;
}

/**
 * The sending half of a link (or of a hub towards one peer): one cursor
 * reader per pattern, all drawing on one window of BATCH frames; one
 * delivery (the records of one channel fetched together) is one BATCH.
 */
export class Forwarder implements Sender {
  private readonly opts: ForwarderOptions;
  private readonly subs: DurableSubscriber[];
  private readonly readers: CursorReader<StoredEnvelope>[];
  private readonly inflight = new Map<number, InFlight>();
  private nextBatch = 1;
  private stopped = false;
  /** Records not sent because the peer was already in their route. */
  loopSkipped = 0;
  private readonly lanes: LaneScheduler;
  private readonly laneOf: (channel: string) => number;
  private readonly latest: (channel: string) => boolean;
  /** Records passed over because a newer one of a `latest` channel went instead. */
  superseded = 0;
  /** When an ACK (or a drain of the connection) last showed that data moves. */
  private lastProgress = 0;
  private drainsSeen = 0;
  private stallTimer: ReturnType<typeof setTimeout> | null = null;

  constructor(opts: ForwarderOptions) {
    this.opts = opts;
    if (opts.volatile) {
      // One name per session: two processes may share an ephemeral certificate.
      const name = `_eph.${opts.session.peer.name}.${Bun.randomUUIDv7()}`;
      this.subs = opts.patterns.map((p) => opts.messenger.openVolatileSubscriber(p, name));
    } else {
      const name = cursorName(opts.session.peer.name);
      this.subs = opts.patterns.map((p) => opts.messenger.openSubscriber(p, name, { from: opts.start }));
    }
    const cap = opts.maxBytesPerS;
    this.lanes = new LaneScheduler(opts.session, { bucket: cap === undefined ? undefined : new TokenBucket(cap, Math.max(512, cap / 4), performance.now()) });
    this.laneOf = opts.laneOf ?? (() => DEFAULT_PRIORITY);
    const maxBytes = cappedBatchBytes(opts.maxBatchBytes, cap) - 1024;
    // A window per pattern: a lane's reader never waits for room that another lane's backlog holds.
    const latest = (channel: string) => opts.messenger.channelPolicy(channel).fullPolicy === "latest";
    this.latest = latest;
    this.readers = this.subs.map((sub) => {
      sub.touch(); // the peer is here: its cursors are not stale
      if (!opts.volatile) this.skipToNewest(sub, latest);
      return new CursorReader(sub, { form: STORED, window: new Window(opts.window), unit: "run", maxRecords: 10_000, maxBytes });
    });
  }

  /**
   * A `latest` channel's backlog for this peer is its newest message only:
   * the cursor moves to just before it, and what it passes over is counted.
   */
  private skipToNewest(sub: DurableSubscriber, latest: (channel: string) => boolean): void {
    for (const [channel, cursor] of sub.positions()) {
      if (!latest(channel)) continue;
      const next = this.opts.messenger.channelLog(channel)?.nextSeq ?? 0;
      if (next - cursor <= 1) continue;
      sub.ack(channel, next - 2);
      this.superseded += next - 1 - cursor;
      this.opts.messenger.noteSuperseded(channel, next - 1 - cursor);
    }
  }

  /** Runs until `stop()` or the session closes. */
  async run(): Promise<void> {
    await Promise.all(this.readers.map((r) => this.pump(r)));
  }

  /**
   * Sends one pattern's deliveries as the reader hands them over; the
   * next ones are fetched once these are out, so what waits to go is at
   * most one fetch per pattern.
   */
  private pump(reader: CursorReader<StoredEnvelope>): Promise<void> {
    const { session } = this.opts;
    const peerBytes = utf8Bytes(session.peer.name);
    const deliver = (ds: Delivery<StoredEnvelope>[]) => {
      if (this.stopped || session.state !== "open") {
        // Not sent: they come again from the cursor with the next session.
        reader.stop();
        return;
      }
      // A lone record (a board's message, one a wake-up) goes out in this call: at the end of the
      // turn it would follow the publisher's PUBACK, whose wake-up can take the core first. Only
      // the first of a turn: the rest (a window over many channels) share the end of the turn's write.
      const now = !this.wroteNow && ds.length === 1 && ds[0]!.records.length === 1;
      if (now) {
        this.wroteNow = true;
        setImmediate(this.turnEnded);
      }
      for (const d of ds) this.send(reader, d, peerBytes, now);
    };
    return reader.run(deliver, () => (this.lanes.busy ? this.lanes.idle() : undefined));
  }

  /** A batch was written in its call this turn (see `pump`). */
  private wroteNow = false;

  private readonly turnEnded = (): void => {
    this.wroteNow = false;
  };

  private send(reader: CursorReader<StoredEnvelope>, d: Delivery<StoredEnvelope>, peerBytes: Uint8Array, now: boolean): void {
    const { session } = this.opts;
    const all = d.records;
    // One batch is one channel: the peer's rules are checked once, not per record.
    const allowed = this.opts.allow?.(d.channel) ?? true;
    // Most often everything fetched goes: then the frame is written from the delivery itself,
    // with no arrays of what goes (this runs for every message a link forwards).
    let whole = allowed && !(all.length > 1 && this.latest(d.channel));
    let requests = false;
    for (let i = 0; whole && i < all.length; i++) {
      const r = all[i]!;
      if (routeIncludes(r.body, r.view, peerBytes)) whole = false;
      else if (r.view.replyToStart >= 0) requests = true;
    }
    let seqs: number[] | null = null;
    let records: Uint8Array[] | null = null;
    if (!whole) {
      // What goes, in one pass without a callback.
      seqs = [];
      records = [];
      requests = false;
      for (let i = 0; i < all.length; i++) {
        const r = all[i]!;
        if (routeIncludes(r.body, r.view, peerBytes)) {
          this.loopSkipped++;
          continue;
        }
        if (!allowed) continue;
        seqs.push(r.seq);
        records.push(r.body);
        if (r.view.replyToStart >= 0) requests = true;
      }
      if (records.length > 1 && this.latest(d.channel)) {
        // Backlogged on a last-value channel: only the newest goes.
        this.superseded += records.length - 1;
        this.opts.messenger.noteSuperseded(d.channel, records.length - 1);
        seqs.splice(0, seqs.length - 1);
        records.splice(0, records.length - 1);
      }
      if (records.length === 0) {
        // Nothing the peer may or should get: done at once (the cursor still waits for any
        // earlier batch of the channel that is unacknowledged).
        reader.ack(d);
        return;
      }
    }
    if (requests && this.opts.onRequest) {
      // The requests among what goes (both in seq order: one walk).
      let k = 0;
      for (const r of all) {
        if (seqs) {
          if (k === seqs.length) break;
          if (r.seq !== seqs[k]) continue;
          k++;
        }
        if (r.view.replyToStart >= 0) this.opts.onRequest(envelopeReplyTo(r.body, r.view)!, r.view.expires);
      }
    }
    const batch = this.nextBatch++;
    if (this.inflight.size === 0) this.lastProgress = performance.now();
    this.inflight.set(batch, { reader, delivery: d });
    if (this.stallTimer === null && this.opts.stallMs) this.armStall(this.opts.stallMs);
    // While the window has room the ACK may come a little later, with others in one write.
    const delayAck = reader.inflight < this.opts.window;
    const frame = seqs && records ? batchFrame({ batch, channel: d.channel, seqs, records, delayAck }) : batchFrameOf(batch, d.channel, all, delayAck);
    this.lanes.push(this.laneOf(d.channel), session.pack(frame), now);
  }

  /** Per lane: what waits to go, and what went. */
  laneStats(): LaneStats[] {
    return this.lanes.stats();
  }

  /** An ACK from the peer: the cursor moves past what the batch covered. */
  onAck(ack: Ack): void {
    const f = this.inflight.get(ack.batch);
    if (!f || f.delivery.channel !== ack.channel) {
      this.opts.logger.warn("ack for an unknown batch ignored", { peer: this.opts.session.peer.name, batch: ack.batch, channel: ack.channel });
      return;
    }
    this.inflight.delete(ack.batch);
    this.lastProgress = performance.now();
    f.reader.ack(f.delivery);
  }

  /**
   * One timer while batches are in flight, armed for when the link would
   * count as stalled; ACKs only note the time, so the timer costs nothing
   * per message.
   */
  private armStall(ms: number): void {
    this.stallTimer = setTimeout(this.checkStall, ms);
    this.stallTimer.unref?.();
  }

  private readonly checkStall = (): void => {
    this.stallTimer = null;
    const { session, stallMs } = this.opts;
    if (this.stopped || session.state !== "open" || this.inflight.size === 0 || !stallMs) return;
    const now = performance.now();
    // Bytes taken by a connection that had been full: a slow path, not a stalled one.
    const drains = session.drains ?? 0;
    if (drains !== this.drainsSeen) {
      this.drainsSeen = drains;
      this.lastProgress = now;
    }
    const idle = now - this.lastProgress;
    if (idle < stallMs) return this.armStall(stallMs - idle);
    this.opts.logger.warn("link stalled: nothing acknowledged although the session is open; reconnecting", { peer: session.peer.name, in_flight: this.inflight.size, ms: Math.round(idle) });
    this.opts.onStall?.();
    session.close("stalled", `no acknowledgement for ${Math.round(idle)} ms with ${this.inflight.size} batches in flight`);
  };

  /** Per channel: messages and bytes stored here that the peer has not acknowledged yet. */
  backlog(): ChannelBacklog[] {
    return backlogOf(this.opts.messenger, this.subs, this.opts.allow);
  }

  /** Batches sent and not yet acknowledged. */
  get unacked(): number {
    return this.inflight.size;
  }

  /** Stops sending; unacknowledged batches are sent again by the next session. */
  stop(): void {
    this.stopped = true;
    if (this.stallTimer) clearTimeout(this.stallTimer);
    this.stallTimer = null;
    this.lanes.stop();
    for (const r of this.readers) r.stop();
    if (this.opts.volatile) for (const sub of this.subs) this.opts.messenger.dropVolatileSubscriber(sub);
  }
}
