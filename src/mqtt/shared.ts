/**
 * MQTT 5 shared subscriptions, `$share/<group>/<filter>`: every client
 * subscribed to the same group and filter is a member, and each message
 * goes to one member only. One durable subscriber per group and pattern
 * (`mqtt-share.<group>`) holds the group's cursor, so the group's place in
 * the log survives members coming and going, and a keyop restart.
 *
 * Messages go to members in turn, each to the next member with room in its
 * window (its receive maximum); a member that leaves with messages still
 * unacknowledged hands them back, and they go to another member (MQTT
 * 4.8.2: "if the Client's Session terminates before it completes, the
 * Server SHOULD send the message to another Client"). The group and its
 * subscriber end when no session holds the subscription any more.
 */
import { CursorReader, type Delivery, STORED } from "../messenger/cursor-reader.ts";
import type { DurableSubscriber, StoredEnvelope } from "../messenger/durable-subscriber.ts";
import { Window } from "../messenger/window.ts";
import type { DeliverySource, SentFrom, SubscriptionOptions } from "./subscription.ts";

/** Messages a group has fetched and not yet seen acknowledged, over all its members. */
const GROUP_WINDOW = 1024;

/** What a group needs of a member session. */
export interface SharedMember {
  /** The member's window of QoS 1 and 2 messages in flight (its receive maximum). */
  readonly window: Window;
  mayReceive(channel: string): boolean;
  /** Sends `r` for the group; true when in flight at QoS 1 or 2 (the member acks `from` later), false when done. */
  deliverShared(r: StoredEnvelope, from: SentFrom, options: SubscriptionOptions): boolean;
}

/** One shared subscription's group, for one keyop pattern. */
export class SharedGroup implements DeliverySource {
  readonly durable = false;
  readonly pattern: string;
  private readonly reader: CursorReader<StoredEnvelope>;
  private readonly members = new Map<SharedMember, { options: SubscriptionOptions; off: () => void }>();
  /** Deliveries fetched (or handed back) and not yet sent to a member, in order. */
  private readonly queue: Delivery<StoredEnvelope>[] = [];
  private turn = 0;
  private stopped = false;

  constructor(sub: DurableSubscriber, pattern: string, onError: (err: unknown) => void) {
    this.pattern = pattern;
    this.reader = new CursorReader(sub, { form: STORED, window: new Window(GROUP_WINDOW), unit: "record", maxRecords: 500 });
    void this.run().catch(onError);
  }

  get subscriber(): DurableSubscriber {
    return this.reader.sub;
  }

  get size(): number {
    return this.members.size;
  }

  /** A session joins (or changes its options, subscribing again). */
  join(member: SharedMember, options: SubscriptionOptions): void {
    const had = this.members.get(member);
    if (had) {
      had.options = options;
      return;
    }
    this.members.set(member, { options, off: member.window.onRoom(this.dispatch) });
    this.dispatch();
  }

  /** A session leaves; what it had unacknowledged it hands back with `returned`. */
  leave(member: SharedMember): void {
    const m = this.members.get(member);
    if (!m) return;
    m.off();
    this.members.delete(member);
  }

  /** A member left before acknowledging `d`: it goes to another member, first. */
  returned(d: Delivery<StoredEnvelope>): void {
    if (this.stopped) return;
    this.queue.unshift(d);
    this.dispatch();
  }

  acked(d: Delivery<StoredEnvelope>): void {
    this.reader.ack(d);
  }

  stop(): void {
    this.stopped = true;
    for (const m of this.members.values()) m.off();
    this.members.clear();
    this.reader.stop();
  }

  private async run(): Promise<void> {
    for (;;) {
      const ds = await this.reader.next();
      if (ds === null) return;
      this.queue.push(...ds);
      this.dispatch();
    }
  }

  /** Sends what waits, each to the next member with room, until none has room. */
  private readonly dispatch = (): void => {
    while (this.queue.length > 0 && !this.stopped) {
      const d = this.queue[0]!;
      const r = d.records[0]!;
      const members = [...this.members];
      let chosen: [SharedMember, SubscriptionOptions] | null = null;
      let allowed = false;
      for (let k = 0; k < members.length; k++) {
        const [member, { options }] = members[(this.turn + k) % members.length]!;
        if (!member.mayReceive(r.channel)) continue;
        allowed = true;
        if (options.qos === 0 || member.window.room() > 0) {
          chosen = [member, options];
          this.turn = (this.turn + k + 1) % members.length;
          break;
        }
      }
      // No member may get it (or none is connected and it cannot wait for one): wait, unless nobody may.
      if (!chosen) {
        if (members.length > 0 && !allowed) {
          this.queue.shift();
          this.reader.ack(d);
          continue;
        }
        return;
      }
      this.queue.shift();
      if (!chosen[0].deliverShared(r, { subscription: this, delivery: d }, chosen[1])) this.reader.ack(d);
    }
  };
}

/** The shared subscriptions of one listener, by group and pattern, and the sessions that hold each. */
export class SharedSubscriptions {
  /** By key: the group (null until a member connects) and the client ids whose sessions hold it. */
  private readonly groups = new Map<string, { group: SharedGroup | null; holders: Set<string> }>();

  constructor(
    private readonly open: (group: string, pattern: string) => DurableSubscriber,
    private readonly drop: (group: string, pattern: string) => Promise<unknown>,
    private readonly onError: (err: unknown) => void,
  ) {}

  /** Shared subscriptions (group and pattern) some session holds. */
  get count(): number {
    return this.groups.size;
  }

  static key(group: string, pattern: string): string {
    return `${group}\u0000${pattern}`;
  }

  /** The group and pattern of a key. */
  static parts(key: string): [string, string] {
    const i = key.indexOf("\u0000");
    return [key.slice(0, i), key.slice(i + 1)];
  }

  /** A persistent session that is away holds `key` (known at start, from the session store). */
  hold(clientId: string, key: string): void {
    let g = this.groups.get(key);
    if (!g) {
      g = { group: null, holders: new Set() };
      this.groups.set(key, g);
    }
    g.holders.add(clientId);
  }

  /** Whether any session holds `key`. */
  held(key: string): boolean {
    return (this.groups.get(key)?.holders.size ?? 0) > 0;
  }

  /** `clientId`'s session joins `group` for `pattern` (connected now, as `member`). */
  join(clientId: string, member: SharedMember, group: string, pattern: string, options: SubscriptionOptions): SharedGroup {
    const key = SharedSubscriptions.key(group, pattern);
    this.hold(clientId, key);
    const g = this.groups.get(key)!;
    g.group ??= new SharedGroup(this.open(group, pattern), pattern, this.onError);
    g.group.join(member, options);
    return g.group;
  }

  /**
   * `clientId`'s session no longer holds the subscription (unsubscribed,
   * or its session ended): the last holder's going ends the group and
   * deletes its subscriber.
   */
  release(clientId: string, key: string): void {
    const g = this.groups.get(key);
    if (!g?.holders.delete(clientId) || g.holders.size > 0) return;
    g.group?.stop();
    this.groups.delete(key);
    const [group, pattern] = SharedSubscriptions.parts(key);
    void this.drop(group, pattern).catch(this.onError);
  }

  /** Every subscription `clientId`'s session holds ends (the session ended or expired). */
  releaseAll(clientId: string): void {
    for (const [key, g] of [...this.groups]) if (g.holders.has(clientId)) this.release(clientId, key);
  }

  /** Stops every group's reader (the listener stops); the subscribers stay for the next start. */
  stop(): void {
    for (const g of this.groups.values()) g.group?.stop();
  }
}
