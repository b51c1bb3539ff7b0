/**
 * In-process members of a queue group: `concurrency` workers calling one
 * handler, each one message at a time, beside whatever other members the
 * subscriber's group has (HTTP streams, WebSockets, MQTT shared
 * subscriptions, other processes). A message is acknowledged when its
 * handler call returns or it went to the dead-letter channel; one whose
 * worker is stopped first goes to another member.
 */
import type { DurableSubscriber } from "./durable-subscriber.ts";
import { type DeliveredFrom, HandlerRunner } from "./handler-runner.ts";
import type { QueueDelivery, QueueGroup, QueueGroups, QueueMember } from "./queue-group.ts";
import type { Handler, SubscriptionHost } from "./subscription.ts";

/** Options of `Messenger.subscribeQueue`. */
export interface QueueSubscribeOptions {
  /** Where a new subscriber starts; ignored for an existing one. Default latest. */
  from?: "earliest" | "latest" | number;
  /** Handler calls at once in this process (default 1). */
  concurrency?: number;
  /** A payload field: messages with the same value go to the same member while it lives, in order. */
  key?: string;
  serviceName?: string;
  maxRetries?: number;
}

/** One worker: a member with room for one message. */
class Worker implements QueueMember {
  busy = false;
  private readonly listeners = new Set<() => void>();

  constructor(private readonly owner: QueueSubscription) {}

  room(): number {
    return this.busy || this.owner.stopping ? 0 : 1;
  }

  onRoom(fn: () => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  take(d: QueueDelivery): boolean {
    this.busy = true;
    this.owner.run(this, d);
    return true;
  }

  free(): void {
    this.busy = false;
    for (const fn of this.listeners) fn();
  }
}

/** A running in-process queue subscription; stop it with `Messenger.unsubscribe`. */
export class QueueSubscription {
  readonly pattern: string;
  readonly name: string;
  /** Set once stopping: workers take nothing more. */
  stopping = false;
  private readonly runner: HandlerRunner;
  private readonly queues: QueueGroups;
  private readonly logOf: (channel: string) => DeliveredFrom | undefined;
  private readonly workers: Worker[] = [];
  private readonly running = new Set<Promise<void>>();
  private group: QueueGroup | null = null;

  /** @internal Made by `Messenger.subscribeQueue`. */
  constructor(
    host: SubscriptionHost,
    queues: QueueGroups,
    sub: DurableSubscriber,
    handler: Handler<unknown>,
    opts: { serviceName: string | undefined; maxRetries: number; concurrency: number; key?: string },
    logOf: (channel: string) => DeliveredFrom | undefined,
  ) {
    this.pattern = sub.pattern;
    this.name = sub.name;
    this.queues = queues;
    this.logOf = logOf;
    this.runner = new HandlerRunner(host, sub.name, handler, opts.serviceName, opts.maxRetries);
    for (let i = 0; i < opts.concurrency; i++) {
      const w = new Worker(this);
      this.workers.push(w);
      this.group = queues.join(sub, w, { key: opts.key });
    }
  }

  /** True until stopped. */
  get active(): boolean {
    return !this.stopping;
  }

  /** Members of the subscriber's group now (this subscription's workers and any others). */
  get members(): number {
    return this.group?.size ?? 0;
  }

  /** @internal A worker's handler call for `d`. */
  run(w: Worker, d: QueueDelivery): void {
    const log = this.logOf(d.channel) ?? { name: d.channel, appendedAt: () => undefined };
    const p = this.runner
      .deliver(log, d.seq, d.record.body)
      .then((done) => {
        // Not done: stopped while retrying; leaving hands it to another member.
        if (done) this.group?.ack(d);
      })
      .finally(() => {
        this.running.delete(p);
        w.free();
      });
    this.running.add(p);
  }

  /** @internal Stops taking messages, waits for running handler calls, and leaves the group. */
  async stop(): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    this.runner.stop();
    while (this.running.size > 0) await Promise.all(this.running);
    if (this.group) for (const w of this.workers) this.queues.leave(this.group, w);
    this.group = null;
  }
}
