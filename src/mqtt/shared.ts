/**
 * MQTT 5 shared subscriptions, `$share/<group>/<filter>`: every client
 * subscribed to the same group and filter is a member, and each message
 * goes to one member only. One durable subscriber per group and pattern
 * (`mqtt-share.<group>`) holds the group's cursor, so the group's place in
 * the log survives members coming and going, and a keyop restart.
 *
 * The members are members of the messenger's queue group of that
 * subscriber (messenger/queue-group.ts), so HTTP streams and in-process
 * workers on the same subscriber name share the messages with them.
 * Messages go to members in turn, each to the next member with room in its
 * window (its receive maximum); a member that leaves with messages still
 * unacknowledged hands them back, and they go to another member (MQTT
 * 4.8.2: "if the Client's Session terminates before it completes, the
 * Server SHOULD send the message to another Client"). The subscriber ends
 * when no session holds the subscription any more.
 */
import type { DurableSubscriber, StoredEnvelope } from "../messenger/durable-subscriber.ts";
import type { QueueDelivery, QueueGroup, QueueGroups, QueueMember } from "../messenger/queue-group.ts";
import type { Window } from "../messenger/window.ts";
import type { DeliverySource, SentFrom, SubscriptionOptions } from "./subscription.ts";

/** What a group needs of a member session. */
export interface SharedMember {
  /** The member's window of QoS 1 and 2 messages in flight (its receive maximum). */
  readonly window: Window;
  mayReceive(channel: string): boolean;
  /** Sends `r` for the group; true when in flight at QoS 1 or 2 (the member acks `from` later), false when done. */
  deliverShared(r: StoredEnvelope, from: SentFrom, options: SubscriptionOptions, pattern: string): boolean;
}

/**
 * One session's place in one shared subscription's queue group: a member
 * of the messenger's group of the subscriber, and the source the session's
 * in-flight messages of it are acknowledged to.
 */
export class SharedMembership implements QueueMember, DeliverySource {
  readonly durable = false;
  readonly pattern: string;
  options: SubscriptionOptions;
  group: QueueGroup | null = null;
  private readonly session: SharedMember;

  constructor(session: SharedMember, pattern: string, options: SubscriptionOptions) {
    this.session = session;
    this.pattern = pattern;
    this.options = options;
  }

  room(): number {
    return this.options.qos === 0 ? Number.POSITIVE_INFINITY : this.session.window.room();
  }

  onRoom(fn: () => void): () => void {
    return this.session.window.onRoom(fn);
  }

  mayReceive(channel: string): boolean {
    return this.session.mayReceive(channel);
  }

  take(d: QueueDelivery): boolean {
    return this.session.deliverShared(d.record, { subscription: this, delivery: d }, this.options, this.pattern);
  }

  acked(d: object): void {
    this.group?.ack(d as QueueDelivery);
  }
}

/** The shared subscriptions of one listener, by group and pattern, and the sessions that hold each. */
export class SharedSubscriptions {
  /** By key: the client ids whose sessions hold it (connected or away). */
  private readonly groups = new Map<string, { holders: Set<string> }>();
  /** Memberships of connected sessions. */
  private readonly joined = new Set<SharedMembership>();

  constructor(
    private readonly queues: QueueGroups,
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
      g = { holders: new Set() };
      this.groups.set(key, g);
    }
    g.holders.add(clientId);
  }

  /** Whether any session holds `key`. */
  held(key: string): boolean {
    return (this.groups.get(key)?.holders.size ?? 0) > 0;
  }

  /** `clientId`'s session joins `group` for `pattern` (connected now, as `member`). */
  join(clientId: string, member: SharedMember, group: string, pattern: string, options: SubscriptionOptions): SharedMembership {
    this.hold(clientId, SharedSubscriptions.key(group, pattern));
    const m = new SharedMembership(member, pattern, options);
    m.group = this.queues.join(this.open(group, pattern), m);
    this.joined.add(m);
    return m;
  }

  /**
   * A connected session leaves the group (it unsubscribed or its connection
   * ended): what it was sent and did not acknowledge goes to another member.
   */
  leave(m: SharedMembership): void {
    if (!this.joined.delete(m) || !m.group) return;
    this.queues.leave(m.group, m);
  }

  /**
   * `clientId`'s session no longer holds the subscription (unsubscribed,
   * or its session ended): the last holder's going ends the group and
   * deletes its subscriber.
   */
  release(clientId: string, key: string): void {
    const g = this.groups.get(key);
    if (!g?.holders.delete(clientId) || g.holders.size > 0) return;
    this.groups.delete(key);
    const [group, pattern] = SharedSubscriptions.parts(key);
    void this.drop(group, pattern).catch(this.onError);
  }

  /** Every subscription `clientId`'s session holds ends (the session ended or expired). */
  releaseAll(clientId: string): void {
    for (const [key, g] of [...this.groups]) if (g.holders.has(clientId)) this.release(clientId, key);
  }

  /** Every connected member leaves (the listener stops); the subscribers stay for the next start. */
  stop(): void {
    for (const m of [...this.joined]) this.leave(m);
  }
}
