/**
 * Store and forward, receiving side: checks every record of a BATCH (a
 * well-formed envelope of the batch's channel; allowed by the peer's publish rules; not
 * already through this instance; not a recent duplicate), appends this
 * instance to its route, stores the survivors in one group commit, and only
 * then ACKs. Records dropped on purpose are audited and still acknowledged,
 * so a bad sender cannot stall a link.
 */
import { channelIs, envelopeChannel, envelopeId, envelopeReplyTo, routeEntry, routeIncludes, routeNames, scanEnvelope, utf8Bytes, withRoute, type EnvelopeView } from "../envelope/scan.ts";
import { KeyopError } from "../errors.ts";
import type { Logger } from "../observability/logger.ts";
import type { AuditLog } from "./audit.ts";
import type { RecentIds } from "./dedup.ts";
import { ackFrame, type Batch } from "./messages.ts";
import type { Link } from "./link.ts";
import type { RecordSink, SinkRecord } from "./sink.ts";

/** What a receiver needs. */
export interface ReceiverOptions {
  /** Where kept records go: the agent's log, or a hub tier's JetStream streams. */
  sink: RecordSink;
  /** This instance's name, appended to every stored record's route. */
  self: string;
  dedup: RecentIds;
  logger: Logger;
  audit?: AuditLog | undefined;
  /** The hub's publish rules for this peer; absent on a link (the hub is trusted for what it sends). */
  allow?: (channel: string) => boolean;
  /** How long an ACK the sender let wait may be held to go out with later ones (default ACK_HOLD_MS). */
  ackHoldMs?: number;
  /** Told of each request stored (a record with reply_to): its inbox and when it expires. */
  onRequest?: (inbox: string, expires: number) => void;
}

/**
 * How long a receiver holds the ACK of a batch whose sender has window to
 * spare. At a steady few hundred messages a second each batch carries one
 * record, and its ACK was a socket write (and a wake-up of the sender) of
 * its own; held this long, several go out in one write. Nothing waits on
 * such an ACK: the sender keeps sending, and only its cursor moves later.
 *
 * A batch that comes longer than this after the one before has its ACK
 * sent at the end of the turn instead: at a board's rate (a message every
 * 10 ms or more) no other ACK would join it, and the hold only added a
 * timer's wake-up to every message. The end of the turn, not at once, so
 * that the ACK goes after what the same turn forwards.
 */
export const ACK_HOLD_MS = 5;

/** Batches of at most this many records are checked in the data callback that brought them. */
const INLINE_RECORDS = 8;

/** Counts of what a receiver did, for status and tests. */
export interface ReceiverStats {
  stored: number;
  loops: number;
  duplicates: number;
  violations: number;
  /** Records that had expired on the way (not stored, still acknowledged). */
  expired: number;
}

/** Handles the BATCH frames of one session, strictly in arrival order. */
/** A record of a batch that is to be stored: its envelope's view, its id and the id's hash. */
interface Kept {
  view: EnvelopeView;
  body: Uint8Array;
  id: string;
  key: number;
}

export class Receiver {
  private readonly opts: ReceiverOptions;
  private chain: Promise<void> = Promise.resolve();
  readonly stats: ReceiverStats = { stored: 0, loops: 0, duplicates: 0, violations: 0, expired: 0 };

  /** This instance's name as route bytes: compared with every route, appended to every stored one. */
  private readonly selfBytes: Uint8Array;
  private readonly selfEntry: Uint8Array;

  private readonly holdMs: number;

  constructor(opts: ReceiverOptions) {
    this.opts = opts;
    this.holdMs = opts.ackHoldMs ?? ACK_HOLD_MS;
    this.selfBytes = utf8Bytes(opts.self);
    this.selfEntry = routeEntry(opts.self);
  }

  /** Ids being stored by batches whose commit has not finished (duplicates across batches in flight). */
  private readonly pending = new Set<string>();

  /**
   * Checks `batch` and starts storing it at once, so that batches arriving
   * while an fdatasync runs share the next one (group commit); the channel
   * log keeps their order. Only the ACKs are chained: each goes out after
   * its own records and every earlier batch's are durable.
   */
  handle(session: Link, batch: Batch): void {
    const now = performance.now();
    const hold = now - this.lastArrival <= this.holdMs;
    this.lastArrival = now;
    this.queue.push({ session, batch, hold });
    if (this.scheduled) return;
    // A small batch with nothing ahead of it is checked at once: the turn it would wait for
    // costs more than the check. Large ones wait their turn (see `pump`).
    if (this.queue.length === 1 && batch.records.length <= INLINE_RECORDS) {
      this.pump();
      return;
    }
    this.scheduled = true;
    setImmediate(this.pump);
  }

  /** Batches received and not yet checked; `hold`: its ACK may wait for others (see ACK_HOLD_MS). */
  private readonly queue: { session: Link; batch: Batch; hold: boolean }[] = [];
  /** When the last batch came (performance.now()). */
  private lastArrival = Number.NEGATIVE_INFINITY;
  private scheduled = false;

  /**
   * Checks one batch per turn of the event loop. Checking a 1 MiB batch takes
   * tens of milliseconds of CPU; done inside the socket's data callback, a
   * window of batches arriving back to back kept Bun from running the
   * file-system completions (the appends and fdatasyncs) until the socket
   * went quiet, so nothing was stored or acknowledged until the whole window
   * had arrived and forwarding ran one window at a time.
   */
  private readonly pump = (): void => {
    this.scheduled = false;
    const next = this.queue.shift();
    if (!next) return;
    const { session, batch, hold } = next;
    const stored = this.store(session, batch);
    // Stored already, and no earlier ACK still waits for its store: this one is next in order.
    if (typeof stored === "boolean" && this.chained === 0) this.acknowledge(session, batch, hold, stored);
    else this.acknowledgeLater(session, batch, hold, stored);
    if (this.queue.length > 0) {
      this.scheduled = true;
      setImmediate(this.pump);
    }
  };

  // The callbacks of `pump` and `store` live in functions of their own: a function that makes a
  // closure anywhere in it allocates its scope on every call until the JIT has optimized it.

  /** The ACK of `batch` on the chain: after its store and every earlier one. */
  private acknowledgeLater(session: Link, batch: Batch, hold: boolean, stored: boolean | Promise<boolean>): void {
    this.chained++;
    this.chain = this.chain.then(async () => {
      try {
        this.acknowledge(session, batch, hold, await stored);
      } finally {
        this.chained--;
      }
    });
  }

  /** ACKs on the chain whose store has not finished (or that have not gone since). */
  private chained = 0;

  /** Sends (or holds) the ACK of `batch`, once it and every earlier batch are stored. */
  private acknowledge(session: Link, batch: Batch, hold: boolean, ok: boolean): void {
    if (!ok || session.state !== "open") return;
    const ack = ackFrame({ batch: batch.batch, channel: batch.channel, upto: batch.seqs[batch.seqs.length - 1]! });
    // An ACK the sender let wait goes out after what this turn forwards: held with later
    // ones, or (when none is likely to come) at the end of the turn.
    if (batch.delayAck) this.hold(session, ack, hold);
    else {
      this.flushAcks();
      session.send(ack);
    }
  }

  /** ACKs held, in order, and the timer (or the end of the turn) that sends them. */
  private held: { session: Link; ack: Uint8Array }[] = [];
  private holdTimer: ReturnType<typeof setTimeout> | undefined;
  /** How many of the held ACKs go at the end of this turn (the rest wait for the timer). */
  private dueNow = 0;

  /** Holds `ack` for ACK_HOLD_MS (`long`) or to the end of this turn. */
  private hold(session: Link, ack: Uint8Array, long: boolean): void {
    this.held.push({ session, ack });
    if (long) this.holdTimer ??= setTimeout(this.flushAcks, this.holdMs);
    else {
      if (this.dueNow === 0) setImmediate(this.flushDue);
      this.dueNow = this.held.length;
    }
  }

  private readonly flushDue = (): void => {
    const n = this.dueNow;
    this.dueNow = 0;
    for (const h of this.held.splice(0, n)) if (h.session.state === "open") h.session.send(h.ack);
  };

  /** Sends every held ACK now (in order), e.g. before the session is closed. */
  readonly flushAcks = (): void => {
    this.dueNow = 0;
    if (this.holdTimer) clearTimeout(this.holdTimer);
    this.holdTimer = undefined;
    const held = this.held;
    if (held.length === 0) return;
    this.held = [];
    for (const h of held) if (h.session.state === "open") h.session.send(h.ack);
  };

  /** Drops held ACKs and their timer: the session is gone (the sender sends those batches again). */
  stop(): void {
    if (this.holdTimer) clearTimeout(this.holdTimer);
    this.holdTimer = undefined;
    this.held = [];
    this.dueNow = 0;
  }

  /**
   * Validates, filters and appends: true once durable (false: the session
   * was closed), at once when the sink stored the records before returning,
   * else as a promise.
   */
  private store(session: Link, batch: Batch): boolean | Promise<boolean> {
    if (session.state !== "open") return false;
    const { dedup, audit } = this.opts;
    const { selfBytes } = this;
    const peer = session.peer.name;
    const keep: Kept[] = [];
    // Duplicates within the batch; a batch of one record (a steady link's usual) needs no set.
    const keepIds = batch.records.length > 1 ? new Set<string>() : null;
    // Every record must be of the batch's channel (checked below), so the rules are checked once.
    const allowed = !this.opts.allow || this.opts.allow(batch.channel);
    const channelBytes = utf8Bytes(batch.channel);
    for (let i = 0; i < batch.records.length; i++) {
      const body = batch.records[i]!;
      let msg: EnvelopeView;
      try {
        // Structure and the routing fields only: the payload's bytes are stored as they came.
        msg = scanEnvelope(body);
      } catch (err) {
        const why = err instanceof Error ? err.message : String(err);
        audit?.record("malformed_frame", { peer, channel: batch.channel, reason: `record is not an envelope: ${why}` });
        session.close("malformed_frame", `record ${batch.seqs[i]} of batch ${batch.batch} is not an envelope: ${why}`);
        return false;
      }
      if (!channelIs(body, msg, channelBytes)) {
        audit?.record("malformed_frame", { peer, channel: batch.channel, reason: `record of channel ${envelopeChannel(body, msg)} in a batch of ${batch.channel}` });
        session.close("malformed_frame", "record channel does not match its batch");
        return false;
      }
      const id = envelopeId(body, msg);
      if (!allowed) {
        this.stats.violations++;
        audit?.record("policy_violation", { peer, channel: batch.channel, id, reason: "outside the peer's publish rules" });
        continue;
      }
      if (routeIncludes(body, msg, selfBytes)) {
        this.stats.loops++;
        audit?.record("loop_dropped", { peer, channel: batch.channel, id, route: routeNames(body, msg) });
        continue;
      }
      if (msg.expires > 0 && msg.expires <= Date.now()) {
        this.stats.expired++;
        continue;
      }
      const key = dedup.hash(id);
      if (dedup.has(id, key) || this.pending.has(id) || keepIds?.has(id)) {
        this.stats.duplicates++;
        audit?.record("duplicate_dropped", { peer, channel: batch.channel, id });
        continue;
      }
      keep.push({ view: msg, body, id, key });
      keepIds?.add(id);
      if (msg.replyToStart >= 0) this.opts.onRequest?.(envelopeReplyTo(body, msg)!, msg.expires);
    }
    if (keep.length === 0) return true;
    const entry = this.selfEntry;
    const records: SinkRecord[] = [];
    for (let i = 0; i < keep.length; i++) records.push({ id: keep[i]!.id, body: withRoute(keep[i]!.body, keep[i]!.view, entry) });
    const { sink } = this.opts;
    let done: undefined | Promise<void>;
    try {
      done = sink.storeNow ? sink.storeNow(batch.channel, records) : sink.store(batch.channel, records);
    } catch (err) {
      return this.notStored(session, batch.channel, err);
    }
    if (done === undefined) {
      this.kept(keep);
      return true;
    }
    return this.storedLater(session, batch.channel, keep, done);
  }

  /** Records whose store is under way: true once it is done, false (the session closed) if it failed. */
  private storedLater(session: Link, channel: string, keep: Kept[], done: Promise<void>): Promise<boolean> {
    // Until it is stored, a later batch that carries one of these ids holds a duplicate.
    for (const k of keep) this.pending.add(k.id);
    const settled = () => {
      for (const k of keep) this.pending.delete(k.id);
    };
    return done.then(
      () => {
        settled();
        this.kept(keep);
        return true;
      },
      (err: unknown) => {
        settled();
        return this.notStored(session, channel, err);
      },
    );
  }

  /** Records stored: remembered as seen, and counted. */
  private kept(keep: readonly { id: string; key: number }[]): void {
    for (const k of keep) this.opts.dedup.seen(k.id, k.key);
    this.stats.stored += keep.length;
  }

  /**
   * Not stored, so not acknowledged: the sender sends it again on the next
   * session. A hub tier whose cluster is down says so (`unavailable`), so
   * that links retry and clients wait.
   */
  private notStored(session: Link, channel: string, err: unknown): false {
    this.opts.logger.error("could not store a forwarded batch", { peer: session.peer.name, channel, error: String(err) });
    const code = err instanceof KeyopError && err.code === "unavailable" ? "unavailable" : "store_failed";
    session.close(code, err instanceof Error ? err.message : String(err));
    return false;
  }
}
