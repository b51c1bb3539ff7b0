/**
 * A queue group: the consumers attached to one durable subscriber share its
 * messages (competing consumers). Each message goes to one member; one a
 * member leaves without acknowledging (its connection closed, its process
 * died) or holds past its ack wait goes to another; and the subscriber's
 * cursor moves past a message only once it and everything before it are
 * acknowledged, whoever acknowledged them and in whatever order.
 *
 * One group per subscriber, whatever the members are: HTTP streams and
 * WebSockets, in-process handlers, MQTT 5 `$share/<group>/<filter>`
 * sessions. A member only says how much room it has and takes a record;
 * the group keeps what each member holds, so that it can hand it on.
 *
 * Order within a channel is given up across a group: members work at their
 * own pace, and a message handed back comes after later ones. With a `key`
 * (a payload field), messages with the same key go to the same member while
 * it is in the group, and so in order.
 */
import { decodeEnvelope } from "../envelope/envelope.ts";
import { ConflictError, InvalidArgumentError } from "../errors.ts";
import { CursorReader, type Delivery, STORED } from "./cursor-reader.ts";
import type { DurableSubscriber, StoredEnvelope } from "./durable-subscriber.ts";
import { Window } from "./window.ts";

/** Messages a group has fetched and not yet seen acknowledged, over all its members. */
export const GROUP_WINDOW = 1024;
/** Keys a group remembers the member of (least recently used forgotten first). */
export const MAX_KEYS = 65_536;

/** What a group needs of a member. */
export interface QueueMember {
  /** Messages it may take now (Infinity: it never holds one, e.g. MQTT QoS 0). */
  room(): number;
  /** Calls `fn` whenever room may have opened; returns the remover. */
  onRoom(fn: () => void): () => void;
  /** Whether it may receive messages of `channel` (an MQTT user's ACL); true when omitted. */
  mayReceive?(channel: string): boolean;
  /**
   * Sends `d.record` to the consumer. True: the member holds it until it is
   * acknowledged (`QueueGroup.ack`), it leaves, or its ack wait passes;
   * false: done with it now (sent without acknowledgement, or passed over).
   */
  take(d: QueueDelivery): boolean;
  /**
   * The member no longer holds `d`: acknowledged (by it or by an ack that
   * came another way), or taken back when its ack wait passed. It gives
   * back the room `d` held.
   */
  release?(d: QueueDelivery): void;
  /** How long it may hold a message unacknowledged before the group gives it to another (ms); unbounded when omitted. */
  readonly ackWaitMs?: number;
}

/** One message of the group, as handed to a member. */
export class QueueDelivery {
  readonly delivery: Delivery<StoredEnvelope>;
  readonly record: StoredEnvelope;
  holder: QueueMember | null = null;
  /** When the holder's ack wait ends (performance.now() ms). */
  deadline = Number.POSITIVE_INFINITY;
  /** Times it was handed to a member (more than 1: a redelivery). */
  handedOut = 0;
  acked = false;
  /** In the group's queue, waiting for a member. */
  queued = false;
  /** The key's value (undefined: not computed yet; null: the message has none). */
  key: string | null | undefined;

  constructor(delivery: Delivery<StoredEnvelope>) {
    this.delivery = delivery;
    this.record = delivery.records[0]!;
  }

  get channel(): string {
    return this.record.channel;
  }

  get seq(): number {
    return this.record.seq;
  }
}

/** How a group runs. */
export interface QueueGroupOptions {
  /** A payload field: messages with the same value go to the same member while it lives. */
  key?: string;
  /** Hears a failure of the group's read loop. */
  onError: (err: unknown) => void;
  /** Clock (ms), for tests. */
  now?: () => number;
}

/** Counts a group reports. */
export interface QueueGroupStats {
  members: number;
  /** Handed to a member and not yet acknowledged. */
  in_hand: number;
  /** Fetched and waiting for a member with room. */
  queued: number;
  /** Handed to another member after one left or its ack wait passed. */
  redelivered: number;
}

/** The competing consumers of one durable subscriber. */
export class QueueGroup {
  readonly key: string | undefined;
  private readonly reader: CursorReader<StoredEnvelope>;
  private readonly opts: QueueGroupOptions;
  private readonly now: () => number;
  private readonly members: QueueMember[] = [];
  private readonly offs = new Map<QueueMember, () => void>();
  /** What each member holds, in the order it was handed out. */
  private readonly holdings = new Map<QueueMember, Set<QueueDelivery>>();
  /** Per channel, by seq: every message fetched and not yet acknowledged (queued or held). */
  private readonly open = new Map<string, Map<number, QueueDelivery>>();
  /** Waiting for a member with room, in order (messages handed back first). */
  private queue: QueueDelivery[] = [];
  /** Key value → member, least recently used first. */
  private readonly keys = new Map<string, QueueMember>();
  private turn = 0;
  private stopped = false;
  private dispatching = false;
  private again = false;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private timerAt = Number.POSITIVE_INFINITY;
  private redelivered = 0;

  constructor(sub: DurableSubscriber, opts: QueueGroupOptions) {
    this.opts = opts;
    this.key = opts.key;
    this.now = opts.now ?? (() => performance.now());
    this.reader = new CursorReader(sub, { form: STORED, window: new Window(GROUP_WINDOW), unit: "record", maxRecords: 500 });
    void this.run().catch(opts.onError);
  }

  get subscriber(): DurableSubscriber {
    return this.reader.sub;
  }

  /** Members in the group now. */
  get size(): number {
    return this.members.length;
  }

  stats(): QueueGroupStats {
    let inHand = 0;
    for (const h of this.holdings.values()) inHand += h.size;
    return { members: this.members.length, in_hand: inHand, queued: this.queue.length, redelivered: this.redelivered };
  }

  /** `member` joins; it gets messages as soon as it has room. */
  join(member: QueueMember): void {
    if (this.stopped) throw new InvalidArgumentError("queue group stopped");
    if (this.holdings.has(member)) return;
    this.members.push(member);
    this.holdings.set(member, new Set());
    this.offs.set(member, member.onRoom(this.dispatch));
    this.dispatch();
  }

  /** `member` leaves: what it holds unacknowledged goes to the others first, in the order it got it. */
  leave(member: QueueMember): void {
    const held = this.holdings.get(member);
    if (!held) return;
    this.offs.get(member)?.();
    this.offs.delete(member);
    this.holdings.delete(member);
    const i = this.members.indexOf(member);
    this.members.splice(i, 1);
    if (this.turn > i) this.turn--;
    for (const [k, m] of this.keys) if (m === member) this.keys.delete(k);
    const back = [...held];
    for (const d of back) d.holder = null;
    this.handBack(back);
  }

  /** The holder of `d` (or anyone) acknowledged it. */
  ack(d: QueueDelivery): void {
    if (d.acked) return;
    d.acked = true;
    const byChannel = this.open.get(d.channel);
    byChannel?.delete(d.seq);
    if (byChannel?.size === 0) this.open.delete(d.channel);
    const h = d.holder;
    if (h) {
      d.holder = null;
      this.holdings.get(h)?.delete(d);
      h.release?.(d);
    } else if (d.queued) {
      d.queued = false;
      this.queue.splice(this.queue.indexOf(d), 1);
    }
    this.reader.ack(d.delivery);
  }

  /**
   * An acknowledgement of one message by channel and seq (an HTTP ack, a
   * WebSocket frame): whoever holds it, or if it waits for a member again
   * (a late ack after its holder's ack wait passed). False when the group
   * has no such open message: it was acknowledged already, or not fetched.
   */
  ackSeq(channel: string, seq: number): boolean {
    const d = this.open.get(channel)?.get(seq);
    if (!d) return false;
    this.ack(d);
    return true;
  }

  /** Stops the read loop; what was not acknowledged comes again from the cursor the next time. */
  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
    for (const off of this.offs.values()) off();
    this.offs.clear();
    this.reader.stop();
  }

  private async run(): Promise<void> {
    for (;;) {
      const ds = await this.reader.next();
      if (ds === null) return;
      for (const x of ds) {
        const d = new QueueDelivery(x);
        let byChannel = this.open.get(d.channel);
        if (!byChannel) {
          byChannel = new Map();
          this.open.set(d.channel, byChannel);
        }
        byChannel.set(d.seq, d);
        d.queued = true;
        this.queue.push(d);
      }
      this.dispatch();
    }
  }

  /** Puts `ds` (in the order they were first handed out) at the front of the queue. */
  private handBack(ds: QueueDelivery[]): void {
    if (ds.length === 0) return;
    ds.sort((a, b) => (a.channel < b.channel ? -1 : a.channel > b.channel ? 1 : a.seq - b.seq));
    for (const d of ds) d.queued = true;
    this.queue = ds.concat(this.queue);
    this.dispatch();
  }

  /** Sends what waits, each to a member with room, until none has room. */
  private readonly dispatch = (): void => {
    // A member's `take` or `release` may open room again while this runs: run once more instead.
    if (this.dispatching) {
      this.again = true;
      return;
    }
    this.dispatching = true;
    try {
      do {
        this.again = false;
        this.dispatchOnce();
      } while (this.again && !this.stopped);
    } finally {
      this.dispatching = false;
    }
  };

  private dispatchOnce(): void {
    let i = 0;
    while (i < this.queue.length && !this.stopped && this.members.length > 0) {
      const d = this.queue[i]!;
      const to = this.pick(d);
      if (to === "nobody") {
        // No member may ever get it (an ACL): passed over, as a subscriber of its own would.
        this.queue.splice(i, 1);
        d.queued = false;
        this.ack(d);
        continue;
      }
      if (to === null) {
        // Unkeyed: no member has room, so none can take anything behind it either.
        if (d.key === null || this.key === undefined) return;
        i++;
        continue;
      }
      this.queue.splice(i, 1);
      d.queued = false;
      this.hand(d, to);
    }
  }

  private hand(d: QueueDelivery, to: QueueMember): void {
    d.handedOut++;
    if (d.handedOut > 1) this.redelivered++;
    d.holder = to;
    const held = this.holdings.get(to)!;
    held.add(d);
    const wait = to.ackWaitMs;
    d.deadline = wait !== undefined && Number.isFinite(wait) ? this.now() + wait : Number.POSITIVE_INFINITY;
    let holds: boolean;
    try {
      holds = to.take(d);
    } catch (err) {
      this.opts.onError(err);
      holds = false;
    }
    if (!holds) {
      d.holder = null;
      held.delete(d);
      this.ack(d);
      return;
    }
    if (d.deadline < this.timerAt) this.arm(d.deadline);
  }

  /** The member for `d`: one with room, null when none has room now, "nobody" when none may have it. */
  private pick(d: QueueDelivery): QueueMember | null | "nobody" {
    const n = this.members.length;
    const channel = d.channel;
    const k = this.keyOf(d);
    if (k !== null) {
      const m = this.keys.get(k);
      if (m && (m.mayReceive?.(channel) ?? true)) {
        this.keys.delete(k);
        this.keys.set(k, m);
        return m.room() > 0 ? m : null;
      }
    }
    let allowed = false;
    let best: QueueMember | null = null;
    let bestAt = 0;
    for (let j = 0; j < n; j++) {
      const at = (this.turn + j) % n;
      const m = this.members[at]!;
      if (!(m.mayReceive?.(channel) ?? true)) continue;
      allowed = true;
      if (m.room() <= 0) continue;
      // A new key goes to the member holding least; otherwise members take turns.
      if (k === null) {
        best = m;
        bestAt = at;
        break;
      }
      if (!best || this.holdings.get(m)!.size < this.holdings.get(best)!.size) {
        best = m;
        bestAt = at;
      }
    }
    if (!best) return allowed ? null : "nobody";
    this.turn = (bestAt + 1) % n;
    if (k !== null) {
      this.keys.set(k, best);
      if (this.keys.size > MAX_KEYS) this.keys.delete(this.keys.keys().next().value!);
    }
    return best;
  }

  private keyOf(d: QueueDelivery): string | null {
    if (this.key === undefined) return null;
    if (d.key !== undefined) return d.key;
    let v: unknown;
    try {
      const p = decodeEnvelope(d.record.body, d.seq).payload;
      v = p !== null && typeof p === "object" ? (p as Record<string, unknown>)[this.key] : undefined;
    } catch {
      v = undefined;
    }
    d.key = v === undefined || v === null ? null : typeof v === "string" ? v : JSON.stringify(v);
    return d.key;
  }

  private arm(at: number): void {
    clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = setTimeout(this.expire, Math.max(0, at - this.now()));
  }

  /** Takes back what members held past their ack wait, hands it on, and sets the timer for the next. */
  private readonly expire = (): void => {
    this.timer = undefined;
    this.timerAt = Number.POSITIVE_INFINITY;
    if (this.stopped) return;
    const now = this.now();
    const back: QueueDelivery[] = [];
    let next = Number.POSITIVE_INFINITY;
    for (const [m, held] of this.holdings) {
      for (const d of held) {
        if (d.deadline > now) {
          next = Math.min(next, d.deadline);
          continue;
        }
        held.delete(d);
        d.holder = null;
        m.release?.(d);
        back.push(d);
      }
    }
    if (Number.isFinite(next)) this.arm(next);
    this.handBack(back);
  };
}

/** The queue groups of one messenger, by subscriber: made on the first member's join, ended with the last's leave. */
export class QueueGroups {
  private readonly groups = new Map<string, QueueGroup>();

  constructor(private readonly onError: (err: unknown) => void) {}

  static keyOf(pattern: string, name: string): string {
    return `${pattern}\u0000${name}`;
  }

  /** The group of a subscriber, while it has members. */
  get(pattern: string, name: string): QueueGroup | undefined {
    return this.groups.get(QueueGroups.keyOf(pattern, name));
  }

  /** `member` joins the group of `sub` (made now if it has none); a `key` must be the group's. */
  join(sub: DurableSubscriber, member: QueueMember, opts: { key?: string } = {}): QueueGroup {
    const k = QueueGroups.keyOf(sub.pattern, sub.name);
    let g = this.groups.get(k);
    if (g && g.key !== opts.key) {
      throw new ConflictError(`subscriber ${sub.name} on ${sub.pattern} is a queue group ${g.key === undefined ? "without a key" : `keyed by "${g.key}"`}; join it with the same key`);
    }
    if (!g) {
      g = new QueueGroup(sub, { key: opts.key, onError: this.onError });
      this.groups.set(k, g);
    }
    g.join(member);
    return g;
  }

  /** `member` leaves `group`; the last one's going ends the group (the subscriber and its cursor stay). */
  leave(group: QueueGroup, member: QueueMember): void {
    group.leave(member);
    if (group.size > 0) return;
    group.stop();
    const k = QueueGroups.keyOf(group.subscriber.pattern, group.subscriber.name);
    if (this.groups.get(k) === group) this.groups.delete(k);
  }

  /** Every group with members, for status. */
  all(): QueueGroup[] {
    return [...this.groups.values()];
  }

  /** Ends every group (the messenger closes). */
  stopAll(): void {
    for (const g of this.groups.values()) g.stop();
    this.groups.clear();
  }
}
