/**
 * Down, for a hub tier: what a board subscribes to and may receive, read
 * from the JetStream streams and sent down its link with the same BATCH
 * frames, window and ACKs as a hub with its own log. The board's position
 * in each stream (the last sequence it acknowledged, with nothing before it
 * unacknowledged) is kept in a PositionStore, so a board that comes back
 * through another hub resumes there: at most about a window is sent again,
 * and the board drops those by id.
 */
import { compileRules, type Matcher } from "../envelope/names.ts";
import { envelopeReplyTo, routeIncludes, scanEnvelope, utf8Bytes } from "../envelope/scan.ts";
import type { AuditLog } from "../federation/audit.ts";
import type { Sender } from "../federation/forwarder.ts";
import type { ChannelBacklog, Link } from "../federation/link.ts";
import { batchFrame, type Ack } from "../federation/messages.ts";
import { cappedBatchBytes } from "../federation/forwarder.ts";
import { LaneScheduler, type LaneStats } from "../federation/lanes.ts";
import { DEFAULT_PRIORITY } from "../federation/priority.ts";
import { TokenBucket } from "../federation/token-bucket.ts";
import { Window } from "../messenger/window.ts";
import type { Logger } from "../observability/logger.ts";
import { downRecord, type StreamMessage } from "./foreign.ts";
import { positionKey, type PositionStore } from "./positions.ts";
import { patternIntersection } from "../envelope/patterns.ts";
import { patternSubject } from "./subjects.ts";

/** Reading streams: the engine in the agent, an in-memory stream in tests. */
export interface StreamSource {
  /** First and last sequence of `stream` now (an empty stream: last < first). */
  bounds(stream: string): Promise<{ first: number; last: number }>;
  /** The messages of `stream` from sequence `from` on, in order, matching `filter` (a subject) when given, until `signal`. */
  read(stream: string, from: number, filter: string | undefined, signal: AbortSignal): AsyncIterable<StreamMessage & { pending?: number }>;
}

/** One stream a board reads: which of its channels, by what filter. */
export interface StreamPlan {
  stream: string;
  /** The board's channels in this stream (keyop patterns). */
  patterns: string[];
  /** The subject filter the stream is read with: one pattern's, or none (the whole stream, matched here) for several. */
  subject: string | undefined;
}

/**
 * The streams a board with `patterns` reads, and how: each pattern meets
 * each stream's channels; one resulting pattern is read with its subject as
 * the filter (nats-server 2.9 takes one filter subject per consumer).
 */
export function planStreams(streams: readonly { name: string; channels: string[] }[], patterns: readonly string[], prefix: string): StreamPlan[] {
  const plans: StreamPlan[] = [];
  for (const s of streams) {
    const inStream: string[] = [];
    for (const p of patterns) {
      for (const c of s.channels) {
        const i = patternIntersection(p, c);
        if (i !== null && !inStream.includes(i)) inStream.push(i);
      }
    }
    if (inStream.length === 0) continue;
    plans.push({ stream: s.name, patterns: inStream, subject: inStream.length === 1 ? patternSubject(prefix, inStream[0]!) : undefined });
  }
  return plans;
}

/** How a stream forwarder runs. */
export interface StreamForwarderOptions {
  source: StreamSource;
  /** Null for an ephemeral peer: live messages only, no position kept. */
  positions: PositionStore | null;
  session: Link;
  /** The tier's instance name (the hubs' CN): the key of positions, the route of wrapped messages. */
  tier: string;
  plans: StreamPlan[];
  /** Only channels this accepts are sent (the peer's subscribe rules). */
  allow: (channel: string) => boolean;
  /** Where a board without a position starts. */
  start: "latest" | "earliest";
  prefix: string;
  window: number;
  maxBatchBytes: number;
  maxMessageBytes: number;
  logger: Logger;
  audit?: AuditLog | undefined;
  /** Told of stream sequences skipped because a position was older than the stream's first message. */
  onExpired?: (skipped: number) => void;
  /** The lane of a channel's batches (federation/priority.ts); one lane when absent. */
  laneOf?: (channel: string) => number;
  /** Cap on the wire bytes of data sent per second; none when absent. */
  maxBytesPerS?: number | undefined;
  /** Told of each request sent (a record with `reply_to`): its inbox and when it expires. */
  onRequest?: ((inbox: string, expires: number) => void) | undefined;
}

/** A stretch of stream sequences: sent in one batch, or passed over. */
interface Span {
  last: number;
  acked: boolean;
}

interface Reading {
  plan: StreamPlan;
  key: string;
  match: Matcher;
  /** Sent or passed over, in stream order, not yet behind the position. */
  spans: Span[];
  pending: number;
}

interface Group {
  reading: Reading;
  channel: string;
  seqs: number[];
  records: Uint8Array[];
  bytes: number;
}

/** What a stream forwarder did, for status and tests. */
export interface StreamForwarderStats {
  sent: number;
  loopSkipped: number;
  /** Messages passed over: outside the peer's rules, not a channel, too large. */
  passed: number;
  /** Stream sequences the board missed because its position was older than the stream's first message. */
  expired: number;
}

/** The sending half of a hub tier's session towards one board. */
export class StreamForwarder implements Sender {
  private readonly o: StreamForwarderOptions;
  private readonly window: Window;
  private readonly stopping = new AbortController();
  private readonly readings: Reading[];
  private readonly inflight = new Map<number, { reading: Reading; span: Span; channel: string; records: number }>();
  /** Wakes a pump waiting for room in the window (or for the stop). */
  private roomWaiters: (() => void)[] = [];
  private nextBatch = 1;
  private group: Group | null = null;
  private flushArmed = false;
  private readonly peerBytes: Uint8Array;
  readonly stats: StreamForwarderStats = { sent: 0, loopSkipped: 0, passed: 0, expired: 0 };

  /** The order batches go out in and the cap: at most `window` wait here, as they hold the window. */
  private readonly lanes: LaneScheduler;
  private readonly maxBatchBytes: number;

  constructor(o: StreamForwarderOptions) {
    this.o = o;
    const cap = o.maxBytesPerS;
    this.lanes = new LaneScheduler(o.session, { bucket: cap === undefined ? undefined : new TokenBucket(cap, Math.max(512, cap / 4), performance.now()) });
    this.maxBatchBytes = cappedBatchBytes(o.maxBatchBytes, cap);
    this.window = new Window(o.window);
    this.peerBytes = utf8Bytes(o.session.peer.name);
    this.readings = o.plans.map((plan) => ({ plan, key: positionKey(o.tier, o.session.peer.name, plan.stream), match: compileRules(plan.patterns), spans: [], pending: 0 }));
  }

  async run(): Promise<void> {
    await Promise.all(this.readings.map((r) => this.pump(r)));
  }

  /** Where reading `r` starts: after the stored position, or by `start` for a board seen first. */
  private async startSeq(r: Reading): Promise<number> {
    const { source, positions, audit, session } = this.o;
    const { first, last } = await source.bounds(r.plan.stream);
    const stored = positions ? await positions.get(r.key) : null;
    if (stored === null) {
      const pos = this.o.start === "earliest" && positions ? Math.max(0, first - 1) : last;
      // Kept at once: a board that comes back before acknowledging anything must not skip what came meanwhile.
      positions?.put(r.key, pos);
      return pos + 1;
    }
    if (stored + 1 < first) {
      const missed = first - stored - 1;
      this.stats.expired += missed;
      this.o.onExpired?.(missed);
      this.o.logger.warn("a board's position is older than the stream's first message: what retention removed is skipped", {
        peer: session.peer.name,
        stream: r.plan.stream,
        position: stored,
        first,
        skipped: missed,
      });
      audit?.record("position_expired", { peer: session.peer.name, stream: r.plan.stream, position: stored, first, skipped: missed });
      positions?.put(r.key, first - 1);
      return first;
    }
    return stored + 1;
  }

  private async pump(r: Reading): Promise<void> {
    const { session } = this.o;
    const signal = this.stopping.signal;
    const from = await this.startSeq(r);
    for await (const m of this.o.source.read(r.plan.stream, from, r.plan.subject, signal)) {
      if (signal.aborted || session.state !== "open") break;
      if (m.pending !== undefined) r.pending = m.pending;
      const rec = downRecord(m, { prefix: this.o.prefix, stream: r.plan.stream, tier: this.o.tier, maxBytes: this.o.maxMessageBytes });
      if ("skip" in rec || !r.match(rec.channel) || !this.o.allow(rec.channel)) {
        this.stats.passed++;
        this.passOver(r, m.seq);
        continue;
      }
      const view = scanEnvelope(rec.body);
      if (routeIncludes(rec.body, view, this.peerBytes)) {
        // It came from this board: never sent back.
        this.stats.loopSkipped++;
        this.passOver(r, m.seq);
        continue;
      }
      if (view.expires > 0 && view.expires <= Date.now()) {
        // Expired (a request nobody waits for any more): not sent, as a hub's own forwarder skips it.
        this.stats.passed++;
        this.passOver(r, m.seq);
        continue;
      }
      // A request: its reply is taken from this board only (federation/reply-routes.ts).
      if (view.replyToStart >= 0 && this.o.onRequest) this.o.onRequest(envelopeReplyTo(rec.body, view)!, view.expires);
      const g = this.group;
      if (g && (g.reading !== r || g.channel !== rec.channel || g.bytes + rec.body.length > this.maxBatchBytes - 1024)) this.flush();
      if (!this.group) {
        // A new batch needs room in the window; the source holds what comes meanwhile.
        while (this.window.room() <= 0 && !signal.aborted) await new Promise<void>((res) => this.roomWaiters.push(res));
        if (signal.aborted) break;
        this.group = { reading: r, channel: rec.channel, seqs: [], records: [], bytes: 0 };
      }
      this.group!.seqs.push(m.seq);
      this.group!.records.push(rec.body);
      this.group!.bytes += rec.body.length;
      // What the source has buffered arrives in this turn's microtasks: the batch goes out after them.
      if (!this.flushArmed) {
        this.flushArmed = true;
        setImmediate(() => {
          this.flushArmed = false;
          this.flush();
        });
      }
    }
  }

  /** A sequence sent nowhere: behind the position once everything before it is acknowledged. */
  private passOver(r: Reading, seq: number): void {
    if (this.group?.reading === r) this.flush(); // keeps the spans in stream order
    const tail = r.spans[r.spans.length - 1];
    if (tail?.acked) tail.last = seq;
    else r.spans.push({ last: seq, acked: true });
    this.advance(r);
  }

  private flush(): void {
    const g = this.group;
    if (!g) return;
    this.group = null;
    const { session } = this.o;
    if (session.state !== "open") return;
    const batch = this.nextBatch++;
    const span: Span = { last: g.seqs[g.seqs.length - 1]!, acked: false };
    g.reading.spans.push(span);
    this.inflight.set(batch, { reading: g.reading, span, channel: g.channel, records: g.records.length });
    this.window.take(0);
    this.stats.sent += g.records.length;
    this.lanes.push(this.o.laneOf?.(g.channel) ?? DEFAULT_PRIORITY, session.pack(batchFrame({ batch, channel: g.channel, seqs: g.seqs, records: g.records })));
  }

  /** Per lane: what waits to go, and what went. */
  laneStats(): LaneStats[] {
    return this.lanes.stats();
  }

  /** Moves the stored position over the acknowledged (or passed-over) prefix. */
  private advance(r: Reading): void {
    let pos = -1;
    while (r.spans.length > 0 && r.spans[0]!.acked) pos = r.spans.shift()!.last;
    if (pos >= 0) this.o.positions?.put(r.key, pos);
  }

  onAck(ack: Ack): void {
    const f = this.inflight.get(ack.batch);
    if (!f || f.channel !== ack.channel) {
      this.o.logger.warn("ack for an unknown batch ignored", { peer: this.o.session.peer.name, batch: ack.batch, channel: ack.channel });
      return;
    }
    this.inflight.delete(ack.batch);
    f.span.acked = true;
    this.window.give(0);
    this.wakeWaiters();
    this.advance(f.reading);
  }

  private wakeWaiters(): void {
    for (const w of this.roomWaiters.splice(0)) w();
  }

  get unacked(): number {
    return this.inflight.size;
  }

  /** Per pattern read: what the stream holds for the board past what was sent, and what is unacknowledged. */
  backlog(): ChannelBacklog[] {
    return this.readings.flatMap((r) => {
      let unacked = 0;
      for (const f of this.inflight.values()) if (f.reading === r) unacked += f.records;
      return r.plan.patterns.map((p) => ({ channel: p, from: 0, messages: r.pending + unacked, bytes: 0 }));
    });
  }

  /** Stops reading; the positions reached so far are written. */
  stop(): void {
    if (this.stopping.signal.aborted) return;
    this.stopping.abort();
    this.lanes.stop();
    this.wakeWaiters();
    for (const r of this.readings) void this.o.positions?.flush(r.key);
  }
}
