/**
 * One consumer reading a durable subscriber: the one loop of watch → fetch
 * → wake, the window of what was sent and not yet acknowledged, and which
 * acknowledgements form a contiguous run that may move the cursor.
 *
 * Every push consumer is a thin adapter over it: a federation forwarder
 * (one delivery = the records of one channel in one BATCH), an MQTT
 * subscription and an HTTP stream (one delivery = one message). The
 * adapter decides what to do with a delivery (send it, or pass over it)
 * and acknowledges it; the reader moves the persisted cursor only past a
 * prefix of acknowledged deliveries, so whatever was sent and not
 * acknowledged comes again after a reconnect or a restart.
 */
import type { Message } from "../envelope/envelope.ts";
import { isWildcard } from "../envelope/names.ts";
import type { DurableSubscriber, FetchOptions, Positions, StoredEnvelope } from "./durable-subscriber.ts";
import type { Window } from "./window.ts";

/** How records are fetched and what they are. */
export interface RecordForm<T> {
  fetch(sub: DurableSubscriber, opts: FetchOptions): Promise<T[]>;
  /** `fetch` from memory: null when nothing was taken and the records are on disk. */
  fetchNow(sub: DurableSubscriber, opts: FetchOptions): T[] | null;
  channel(r: T): string;
  seq(r: T): number;
  /** Bytes the window counts for the record. */
  bytes(r: T): number;
  /** Whether `bytes` counts anything (decoded messages are windowed by count only). */
  sized: boolean;
}

/** Decoded messages (MQTT, HTTP streams). Their window is a count: a receive maximum, max_inflight. */
export const MESSAGES: RecordForm<Message> = {
  fetch: (sub, opts) => sub.fetch(opts),
  fetchNow: (sub, opts) => sub.fetchNow(opts),
  channel: (m) => m.channel,
  seq: (m) => m.seq,
  bytes: () => 0,
  sized: false,
};

/** Stored envelopes as they are on disk (federation: forwarded as stored, never decoded). */
export const STORED: RecordForm<StoredEnvelope> = {
  fetch: (sub, opts) => sub.fetchRaw(opts),
  fetchNow: (sub, opts) => sub.fetchRawNow(opts),
  channel: (r) => r.channel,
  seq: (r) => r.seq,
  bytes: (r) => r.body.length,
  sized: true,
};

/** Records sent together and acknowledged together. */
export interface Delivery<T> {
  readonly channel: string;
  readonly records: T[];
  /** Seq of the last record: acknowledging the delivery acknowledges through it. */
  readonly last: number;
  readonly bytes: number;
}

/** How a reader runs. */
export interface CursorReaderOptions<T> {
  form: RecordForm<T>;
  /** What it may have in flight; may be shared with other readers. */
  window: Window;
  /** "record": each record is a delivery; "run": the records of one channel in one fetch are. */
  unit: "record" | "run";
  /**
   * What the window counts: deliveries (a federation BATCH, an MQTT QoS 1
   * message) or records (a stream's max_inflight, whatever its deliveries).
   */
  windowCounts?: "deliveries" | "records";
  /** Most records per fetch. */
  maxRecords: number;
  /** About the most body bytes per fetch (at least one record is fetched). */
  maxBytes?: number;
}

/**
 * What the reader keeps of a delivery until the cursor passes it: no
 * records (holding thousands of decoded messages for a cumulative ack would
 * only feed the collector), just its seqs, size and what of the window it holds.
 */
class Entry {
  readonly owner: object;
  readonly channel: string;
  readonly first: number;
  readonly last: number;
  acked = false;
  /** Window units still held (deliveries: 1; records: those not yet behind the cursor). */
  held: number;
  /** Bytes still held (given back when the whole delivery is done). */
  heldBytes: number;
  /** Records before this seq are behind the cursor (records window only). */
  passedTo: number;
  /** The seqs of a run that is not consecutive (damage skipped in the middle), else null. */
  seqs: number[] | null = null;

  constructor(owner: object, channel: string, first: number, last: number, bytes: number, units: number) {
    this.owner = owner;
    this.channel = channel;
    this.first = first;
    this.last = last;
    this.held = units;
    this.heldBytes = bytes;
    this.passedTo = first;
  }
}

/** A delivery as handed to the consumer, which holds it (and its records) while it needs them. */
class HandedOut<T> implements Delivery<T> {
  readonly entry: Entry;
  readonly records: T[];
  readonly bytes: number;

  constructor(entry: Entry, records: T[], bytes: number) {
    this.entry = entry;
    this.records = records;
    this.bytes = bytes;
  }

  get channel(): string {
    return this.entry.channel;
  }

  get last(): number {
    return this.entry.last;
  }
}

/** Per channel, the deliveries handed out and not yet behind the cursor, in order. */
class Queue {
  items: Entry[] = [];
  head = 0;

  /** Drops the first `n` (kept as a moving head; compacted now and then). */
  drop(n: number): void {
    this.head += n;
    if (this.head > 1024 && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
  }

  get empty(): boolean {
    return this.head >= this.items.length;
  }
}

/** What `poll` returns when there is nothing to hand out now, and when the records are on disk. */
const NOTHING: never[] = [];
const ON_DISK = Symbol("on disk");

interface Driver<T> {
  deliver(ds: Delivery<T>[]): void;
  ready(): Promise<void> | undefined;
  resolve(): void;
  reject(err: unknown): void;
}

/** The reader of one durable subscriber for one consumer. */
export class CursorReader<T> {
  readonly sub: DurableSubscriber;
  private readonly opts: CursorReaderOptions<T>;
  private readonly countRecords: boolean;
  /** Next seq to fetch per channel: past everything handed out. */
  private readonly sent: Positions;
  /** Per channel, deliveries handed out and not yet behind the cursor, in order. */
  private readonly pending = new Map<string, Queue>();
  /** Window units held by what was handed out and not yet acknowledged. */
  private held = 0;
  private readonly offs: (() => void)[] = [];
  private watching = false;
  private stopped = false;
  /** Something was committed, acknowledged or created since the last fetch began. */
  private dirty = true;
  private wake: (() => void) | null = null;
  /** The consumer of `run`, if it runs. */
  private driver: Driver<T> | null = null;
  /** `run`'s loop is going, or waits for a read or the consumer. */
  private busy = false;
  /** A step is queued as a microtask. */
  private scheduled = false;
  /** The subscriber's pattern may match several channels (a fetch may then hold several runs). */
  private readonly wildcard: boolean;

  constructor(sub: DurableSubscriber, opts: CursorReaderOptions<T>) {
    this.sub = sub;
    this.opts = opts;
    this.wildcard = isWildcard(sub.pattern);
    this.countRecords = opts.windowCounts === "records";
    // Start at the acked cursor: what an earlier consumer was sent and did not acknowledge comes again.
    this.sent = sub.positions();
    this.offs.push(
      opts.window.onRoom(this.poke),
      sub.onAck((channel, cursor) => this.behindCursor(channel, cursor)),
    );
  }

  /** What was handed out and not yet acknowledged, in the window's units. */
  get inflight(): number {
    return this.held;
  }

  /**
   * The next deliveries, once there are records past what was handed out
   * and room in the window; [] when `idleMs` passed without (a consumer's
   * keep-alive), null once stopped or on `signal`.
   */
  async next(opts: { idleMs?: number; signal?: AbortSignal } = {}): Promise<Delivery<T>[] | null> {
    this.startWatching();
    const deadline = opts.idleMs === undefined ? Number.POSITIVE_INFINITY : performance.now() + opts.idleMs;
    while (!this.stopped && !opts.signal?.aborted) {
      const got = this.poll();
      if (got === ON_DISK) {
        const ds = await this.fromDisk();
        if (this.stopped || opts.signal?.aborted) return null;
        if (ds.length > 0) return ds;
        continue;
      }
      if (got.length > 0) return got;
      if (!this.dirty || this.opts.window.room() <= 0) {
        const left = deadline - performance.now();
        if (left <= 0) return [];
        await this.sleep(left, opts.signal);
      }
    }
    return null;
  }

  /**
   * Hands deliveries to `deliver` as records come and the window has room,
   * until `stop()`. While the records are in memory and `ready` answers
   * undefined (the consumer takes more at once), a commit is carried to
   * `deliver` in one microtask, with no promise or timer per delivery;
   * `ready` returns a promise while the consumer is busy (its output
   * queue), and the reader looks again once it settles. The promise
   * returned settles when the reader stops, or rejects with what `deliver`
   * or a read threw.
   */
  run(deliver: (ds: Delivery<T>[]) => void, ready: () => Promise<void> | undefined): Promise<void> {
    if (this.driver) throw new Error("the reader is already running");
    this.startWatching();
    return new Promise<void>((resolve, reject) => {
      this.driver = { deliver, ready, resolve, reject };
      // The first look in a microtask, as a fetch would: whatever the caller writes right after
      // starting the reader (an MQTT SUBACK) goes out before the first delivery.
      if (this.stopped) resolve();
      else this.schedule();
    });
  }

  /** Sets the commit and new-channel watch once; it is set before the first fetch, so no commit is missed. */
  private startWatching(): void {
    if (this.watching) return;
    this.watching = true;
    this.offs.push(this.sub.watch(this.poke));
  }

  /**
   * One look without waiting: the deliveries there is room for, [] when
   * there is nothing to do until the next poke, ON_DISK when the next
   * records must be read from disk (`fromDisk`).
   */
  private poll(): Delivery<T>[] | typeof ON_DISK {
    const room = this.opts.window.room();
    // An acknowledgement and room given back poke too, and when the consumer keeps up nothing
    // is past what it was handed: then there is nothing to fetch.
    if (room <= 0 || !this.dirty) return NOTHING;
    this.dirty = false;
    if (!this.sub.hasAfter(this.sent)) return NOTHING;
    const f = this.fetchOptions(room);
    const recs = this.opts.form.fetchNow(this.sub, f);
    if (recs === null) {
      this.dirty = true;
      return ON_DISK;
    }
    if (recs.length === 0) return NOTHING;
    this.dirty = true; // there may be more
    return this.deliveries(recs, room, f.handsOutAll);
  }

  /** The next deliveries read from disk; [] when there were none after all. */
  private async fromDisk(): Promise<Delivery<T>[]> {
    const room = this.opts.window.room();
    if (room <= 0) return [];
    this.dirty = false;
    const f = this.fetchOptions(room);
    const recs = await this.opts.form.fetch(this.sub, f);
    if (this.stopped || recs.length === 0) return [];
    this.dirty = true;
    return this.deliveries(recs, room, f.handsOutAll);
  }

  private fetchOptions(room: number): FetchOptions & { handsOutAll: boolean } {
    // Every fetched record is handed out when each record takes room (one per delivery, or a
    // records window); otherwise channels past the room must not move, and the fetch gets a copy.
    const handsOutAll = this.opts.unit === "record" || this.countRecords;
    // A fetch holds at most one run per channel: with room for one of each, all of it is
    // handed out too, and the fetch may move the positions itself.
    const after = handsOutAll || room >= this.sub.channelCount() ? this.sent : new Map(this.sent);
    const max = handsOutAll ? Math.min(room, this.opts.maxRecords) : this.opts.maxRecords;
    return { max, maxBytes: this.opts.maxBytes, after, handsOutAll };
  }

  /** The push loop of `run`: as far as it can go now; a read from disk or a busy consumer resumes it later. */
  private readonly step = (): void => {
    this.scheduled = false;
    const d = this.driver;
    if (!d || this.busy) return;
    this.busy = true;
    try {
      for (;;) {
        if (this.stopped) break;
        const got = this.poll();
        if (got === ON_DISK) {
          this.readFromDisk();
          return;
        }
        if (got.length === 0) break;
        if (this.handOver(d, got)) return;
      }
    } catch (err) {
      this.fail(err);
      return;
    }
    this.busy = false;
    // A poke that came while the loop ran found it busy.
    if (this.dirty && !this.stopped && this.opts.window.room() > 0) this.schedule();
  };

  /** Back from a read from disk or a wait for the consumer: hands over what was read, then steps on. */
  private resume(ds: Delivery<T>[]): void {
    const d = this.driver;
    if (!d) return;
    try {
      if (ds.length > 0 && !this.stopped && this.handOver(d, ds)) return;
    } catch (err) {
      this.fail(err);
      return;
    }
    this.busy = false;
    this.step();
  }

  /** Hands `ds` to the consumer; true when it is behind, and the loop resumes once it is ready. */
  private handOver(d: Driver<T>, ds: Delivery<T>[]): boolean {
    d.deliver(ds);
    const wait = this.stopped ? undefined : d.ready();
    if (!wait) return false;
    this.resumeAfter(wait);
    return true;
  }

  // The callbacks of `step` and `handOver` live in functions of their own: a function that makes
  // a closure anywhere in it allocates its scope on every call until the JIT has optimized it.

  private readFromDisk(): void {
    this.fromDisk().then((ds) => this.resume(ds), this.fail);
  }

  private resumeAfter(wait: Promise<void>): void {
    wait.then(() => this.resume([]), this.fail);
  }

  private readonly fail = (err: unknown): void => {
    const d = this.driver;
    this.busy = false;
    d?.reject(err); // before `stop`, which would settle the promise as a plain end
    this.stop();
  };

  private schedule(): void {
    if (this.scheduled || this.busy || !this.driver) return;
    this.scheduled = true;
    queueMicrotask(this.step);
  }

  /** The consumer is done with `d` (the peer or client acknowledged it, or it was passed over). */
  ack(d: Delivery<T>): void {
    const e = d instanceof HandedOut ? d.entry : null;
    if (!e || e.owner !== this || e.acked) return;
    e.acked = true;
    this.release(e);
    // After `stop` an acknowledgement only gives its room back (an MQTT client acking after
    // unsubscribing); the subscriber may be gone.
    const q = this.pending.get(e.channel);
    if (this.stopped || !q) return;
    let upto = -1;
    for (let k = q.head; k < q.items.length; k++) {
      const x = q.items[k]!;
      if (!x.acked) break;
      upto = x.last;
    }
    // The subscriber's ack listener (behindCursor) drops the acknowledged prefix.
    if (upto >= 0) this.sub.ack(e.channel, upto);
  }

  /**
   * Cumulative acknowledgement from a client: everything on `channel` up to
   * and including `seq`. Returns the new cursor.
   */
  ackThrough(channel: string, seq: number): number {
    return this.sub.ack(channel, seq);
  }

  /**
   * Stops the loop (a waiting `next` returns null) and lets go of the
   * subscriber. What is in flight keeps its room in the window until it is
   * acknowledged; unacknowledged, it comes again from the cursor next time.
   */
  stop(): void {
    this.stopped = true;
    for (const off of this.offs.splice(0)) off();
    this.poke();
    this.driver?.resolve();
  }

  /** Gives what `e` still holds back to the window. */
  private release(e: Entry): void {
    if (e.held === 0 && e.heldBytes === 0) return;
    this.held -= e.held;
    this.opts.window.give(e.heldBytes, e.held);
    e.held = 0;
    e.heldBytes = 0;
  }

  /** Groups fetched records into deliveries within `room`, marks them handed out and taken from the window. */
  private deliveries(recs: T[], room: number, handsOutAll: boolean): Delivery<T>[] {
    const { form, unit } = this.opts;
    const out: Delivery<T>[] = [];
    if (unit === "record") {
      for (const r of recs) this.handOut(out, form.channel(r), [r], form.bytes(r), handsOutAll);
      return out;
    }
    // One channel (a subscriber of a plain channel, or a fetch that found one): one run, no copy.
    const channel = form.channel(recs[0]!);
    let one = form.channel(recs[recs.length - 1]!) === channel;
    if (one && this.wildcard) for (let i = 1; i < recs.length - 1 && one; i++) one = form.channel(recs[i]!) === channel;
    if (one) {
      let bytes = 0;
      if (form.sized) for (const r of recs) bytes += form.bytes(r);
      this.handOut(out, channel, recs, bytes, handsOutAll);
      return out;
    }
    const byChannel = new Map<string, { records: T[]; bytes: number }>();
    for (const r of recs) {
      const c = form.channel(r);
      const run = byChannel.get(c);
      if (run) {
        run.records.push(r);
        run.bytes += form.bytes(r);
      } else byChannel.set(c, { records: [r], bytes: form.bytes(r) });
    }
    // Channels past the room are fetched again next time: their position does not move.
    for (const [channel, run] of byChannel) {
      if (!handsOutAll && out.length >= room) break;
      this.handOut(out, channel, run.records, run.bytes, handsOutAll);
    }
    return out;
  }

  /** One channel's run of `records` as a delivery into `out`: taken from the window and pending until acknowledged. */
  private handOut(out: Delivery<T>[], channel: string, records: T[], bytes: number, handsOutAll: boolean): void {
    const { form, window } = this.opts;
    const units = this.countRecords ? records.length : 1;
    const e = new Entry(this, channel, form.seq(records[0]!), form.seq(records[records.length - 1]!), bytes, units);
    window.take(bytes, units);
    this.held += units;
    let q = this.pending.get(channel);
    if (!q) {
      q = new Queue();
      this.pending.set(channel, q);
    }
    if (this.countRecords && e.last - e.first + 1 !== records.length) e.seqs = records.map((r) => form.seq(r));
    q.items.push(e);
    // (When everything fetched is handed out, the fetch moved the position itself.)
    if (!handsOutAll) this.sent.set(channel, e.last + 1);
    out.push(new HandedOut(e, records, bytes));
  }

  /** The cursor of `channel` moved to `cursor`: what is behind it is done, whoever acknowledged it. */
  private behindCursor(channel: string, cursor: number): void {
    const q = this.pending.get(channel);
    if (q) {
      let k = q.head;
      let units = 0;
      let bytes = 0;
      for (; k < q.items.length; k++) {
        const d = q.items[k]!;
        if (d.last < cursor) {
          d.acked = true;
          units += d.held;
          bytes += d.heldBytes;
          this.held -= d.held;
          d.held = 0;
          d.heldBytes = 0;
          continue;
        }
        if (this.countRecords && cursor > d.passedTo) {
          // A run the cursor is in the middle of: its records behind the cursor give their room back.
          const n = d.seqs ? d.seqs.filter((x) => x >= d.passedTo && x < cursor).length : cursor - d.passedTo;
          d.passedTo = cursor;
          units += n;
          d.held -= n;
          this.held -= n;
        }
        break;
      }
      q.drop(k - q.head);
      if (q.empty) this.pending.delete(channel);
      // One wake for the lot (a client acks a thousand at once).
      if (units > 0 || bytes > 0) this.opts.window.give(bytes, units);
    }
    if ((this.sent.get(channel) ?? 0) < cursor) this.sent.set(channel, cursor);
    this.poke();
  }

  private readonly poke = (): void => {
    this.dirty = true;
    const w = this.wake;
    this.wake = null;
    w?.();
    if (this.driver && !this.stopped) this.schedule();
  };

  private sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", done);
        if (this.wake === done) this.wake = null;
        resolve();
      };
      const timer = Number.isFinite(ms) ? setTimeout(done, ms) : undefined;
      signal?.addEventListener("abort", done, { once: true });
      this.wake = done;
    });
  }
}
