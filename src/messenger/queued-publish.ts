/**
 * One publish handed to its channel's log as the log's pending entry
 * itself, settled by the log's method calls. For a caller that publishes
 * many messages in one turn and is told of each by a call (an MQTT
 * client's window of QoS 1 publishes): a promise per message, its
 * executor, the async function's own promise, the result object and the
 * caller's two callbacks were most of the cells such a message left, and
 * their reactions a microtask each.
 */
import type { Histogram } from "../observability/histogram.ts";
import type { Pending } from "../store/channel-log.ts";

/** Told how a publish made with `Messenger.publishTo` came out. */
export interface PublishWaiter {
  /**
   * Called once: `err` is undefined when the message is durable, else why
   * it was not stored. It must not throw: it may run inside the log's
   * commit.
   */
  publishSettled(err: unknown): void;
}

/** What a stored publish is counted in. */
export interface PublishCounters {
  published: number;
}

export class QueuedPublish implements Pending {
  constructor(
    readonly body: Uint8Array,
    /** performance.now() when the publish was taken. */
    readonly at: number,
    private readonly counters: PublishCounters,
    private readonly latency: Histogram,
    private readonly waiter: PublishWaiter,
  ) {}

  resolve(_seq: number): void {
    this.latency.record(performance.now() - this.at);
    this.counters.published++;
    this.waiter.publishSettled(undefined);
  }

  reject(err: unknown): void {
    this.waiter.publishSettled(err);
  }
}
