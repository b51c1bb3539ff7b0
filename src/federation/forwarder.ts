/**
 * Store and forward, sending side: for one session, reads the local log
 * through durable cursors (one subscriber `_fed.<peer>` per pattern, so the
 * position survives restarts and pins retention), sends BATCH frames of
 * stored records as they are stored, keeps at most `window` unacknowledged,
 * and moves the persisted cursor only when the peer's ACK arrives.
 */
import { routeIncludes, utf8Bytes } from "../envelope/scan.ts";
import type { Messenger } from "../messenger/messenger.ts";
import type { DurableSubscriber, Positions } from "../messenger/durable-subscriber.ts";
import type { Logger } from "../observability/logger.ts";
import { batchFrame, type Ack } from "./messages.ts";
import type { PeerSession } from "./session.ts";

/** How a forwarder runs. */
export interface ForwarderOptions {
  messenger: Messenger;
  session: PeerSession;
  /** Local channels to send. */
  patterns: string[];
  /** Only channels this accepts are sent (the hub's subscribe rules for the peer). */
  allow?: (channel: string) => boolean;
  /** Where a new cursor starts. */
  start: "latest" | "earliest";
  window: number;
  maxBatchBytes: number;
  logger: Logger;
  /**
   * Cursors in memory only, from the latest message, dropped when the
   * forwarder stops: for ephemeral peers (live messages, no replay, no hub
   * cursor file, nothing pinned in retention).
   */
  volatile?: boolean;
}

/** What a peer has not acknowledged on one channel. */
export interface ChannelBacklog {
  channel: string;
  messages: number;
  /** Record bytes (headers included) from the peer's cursor on; see ChannelLog#bytesFrom. */
  bytes: number;
}

/** Per channel, what the durable cursors `subs` have not acknowledged (channels `allow` accepts). */
export function backlogOf(messenger: Messenger, subs: DurableSubscriber[], allow?: (channel: string) => boolean): ChannelBacklog[] {
  const out = new Map<string, ChannelBacklog>();
  for (const sub of subs) {
    for (const [channel, cursor] of sub.positions()) {
      const log = messenger.channelLog(channel);
      if (!log || (allow && !allow(channel))) continue;
      const acc = out.get(channel) ?? { channel, messages: 0, bytes: 0 };
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

interface InFlight {
  sub: DurableSubscriber;
  channel: string;
  /** Highest seq this batch accounts for (records skipped for loops included). */
  covers: number;
}

/** The sending half of a link (or of a hub towards one peer). */
export class Forwarder {
  private readonly opts: ForwarderOptions;
  private readonly subs: DurableSubscriber[];
  private readonly sent = new Map<DurableSubscriber, Positions>();
  private readonly inflight = new Map<number, InFlight>();
  private nextBatch = 1;
  private stopped = false;
  private wake: (() => void) | null = null;
  /** Something was committed or created since the last fetch began. */
  private dirty = true;
  /** Records not sent because the peer was already in their route. */
  loopSkipped = 0;

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
    for (const s of this.subs) {
      s.touch(); // the peer is here: its cursors are not stale
      this.sent.set(s, s.positions());
    }
  }

  /** Runs until `stop()` or the session closes. */
  async run(): Promise<void> {
    const { session, window } = this.opts;
    // New records and channels only set a flag and wake the loop; set before a fetch starts,
    // the flag cannot miss a commit that lands while the fetch runs.
    const unwatch = this.subs.map((s) => s.watch(this.poke));
    try {
      while (!this.stopped && session.state === "open") {
        if (this.inflight.size >= window) {
          await new Promise<void>((r) => (this.wake = r));
          continue;
        }
        this.dirty = false;
        const sentSomething = await this.sendOne();
        if (!sentSomething && !this.dirty && !this.stopped) await new Promise<void>((r) => (this.wake = r));
        await session.writable();
      }
    } finally {
      for (const off of unwatch) off();
    }
  }

  private readonly poke = (): void => {
    this.dirty = true;
    const w = this.wake;
    this.wake = null;
    w?.();
  };

  /**
   * Sends what the first subscriber with records has: one batch per channel
   * fetched, while the window allows. False if no subscriber had records.
   */
  private async sendOne(): Promise<boolean> {
    const { session, maxBatchBytes, window } = this.opts;
    const peerBytes = utf8Bytes(session.peer.name);
    for (const sub of this.subs) {
      const after = this.sent.get(sub)!;
      const recs = await sub.fetchRaw({ max: 10_000, maxBytes: maxBatchBytes - 1024, after: new Map(after) });
      if (recs.length === 0) continue;
      const byChannel = new Map<string, typeof recs>();
      for (const r of recs) {
        const list = byChannel.get(r.channel);
        if (list) list.push(r);
        else byChannel.set(r.channel, [r]);
      }
      for (const [channel, mine] of byChannel) {
        // Channels not sent now are fetched again next round: their position does not move.
        if (this.inflight.size >= window) break;
        const covers = mine[mine.length - 1]!.seq;
        after.set(channel, covers + 1);
        const looped = mine.filter((r) => routeIncludes(r.body, r.view, peerBytes));
        this.loopSkipped += looped.length;
        // One batch is one channel: the peer's rules are checked once, not per record.
        const allowed = this.opts.allow?.(channel) ?? true;
        const toSend = allowed ? mine.filter((r) => !routeIncludes(r.body, r.view, peerBytes)) : [];
        if (toSend.length === 0) {
          // Nothing the peer may or should get. If a batch of this channel is still unacknowledged,
          // it now also covers these (acks come in order); acking here would skip past it.
          const pending = [...this.inflight.values()].reverse().find((f) => f.sub === sub && f.channel === channel);
          if (pending) pending.covers = covers;
          else {
            const log = this.opts.messenger.channelLog(channel);
            if (log) sub.ack(log, covers);
          }
          continue;
        }
        const batch = this.nextBatch++;
        this.inflight.set(batch, { sub, channel, covers });
        session.send(batchFrame({ batch, channel, seqs: toSend.map((r) => r.seq), records: toSend.map((r) => r.body) }));
      }
      return true;
    }
    return false;
  }

  /** An ACK from the peer: the cursor moves past what the batch covered. */
  onAck(ack: Ack): void {
    const f = this.inflight.get(ack.batch);
    if (!f || f.channel !== ack.channel) {
      this.opts.logger.warn("ack for an unknown batch ignored", { peer: this.opts.session.peer.name, batch: ack.batch, channel: ack.channel });
      return;
    }
    this.inflight.delete(ack.batch);
    const log = this.opts.messenger.channelLog(f.channel);
    if (log) f.sub.ack(log, f.covers);
    const w = this.wake;
    this.wake = null;
    w?.();
  }

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
    this.poke();
    if (this.opts.volatile) for (const sub of this.subs) this.opts.messenger.dropVolatileSubscriber(sub);
  }
}
