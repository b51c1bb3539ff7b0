/**
 * A running handler subscription: one delivery loop per matching channel.
 *
 * Each loop reads from its channel's log at the subscriber's cursor, calls
 * the handler one message at a time (order per channel), and moves the
 * cursor only after the handler returns, or after the message went to the
 * dead-letter channel. Loops sleep on the log's commit signal, so delivery
 * follows a publish without any polling delay.
 */
import type { ChannelLog } from "../store/channel-log.ts";
import type { CursorState, StartFrom } from "../store/cursor-store.ts";
import { type Handler, HandlerRunner, type SubscriptionHost } from "./handler-runner.ts";

export type { Handler, SubscriptionHost };

/** Options of `Messenger.subscribe`. */
export interface SubscribeOptions {
  /** Where a new subscriber starts; ignored for an existing one. Default latest. */
  from?: StartFrom;
  /** Service name stamped on what the handler publishes. */
  serviceName?: string;
  /** Overrides `subscribers.maxRetries` for this subscription. */
  maxRetries?: number;
}

const READ_BATCH = 256;

/** A handler subscription; stop it with `Messenger.unsubscribe`. */
export class Subscription {
  readonly pattern: string;
  readonly name: string;
  private readonly host: SubscriptionHost;
  private readonly state: CursorState;
  private readonly runner: HandlerRunner;
  private readonly loops = new Map<string, Promise<void>>();
  private readonly wakers = new Set<() => void>();
  private stopped = false;

  /** @internal Created by `Messenger.subscribe`. */
  constructor(host: SubscriptionHost, state: CursorState, handler: Handler<unknown>, serviceName: string | undefined, maxRetries: number) {
    this.host = host;
    this.state = state;
    this.pattern = state.pattern;
    this.name = state.name;
    this.runner = new HandlerRunner(host, state.name, handler, serviceName, maxRetries);
  }

  /** Channels this subscription is delivering from. */
  get channels(): string[] {
    return [...this.loops.keys()];
  }

  /** True until stopped. */
  get active(): boolean {
    return !this.stopped;
  }

  /** @internal Starts delivering from `log` (a matching channel). */
  attach(log: ChannelLog): void {
    if (this.stopped || this.loops.has(log.name)) return;
    if (this.state.cursors[log.name] === undefined) {
      // A channel without a cursor appeared after the subscriber was made: all of it is new.
      const from = this.state.from;
      this.host.cursors.set(this.state, log.name, typeof from === "number" ? Math.max(from, log.firstSeq) : log.firstSeq);
    }
    const loop = this.run(log).catch((err) => {
      this.host.logger.error("delivery loop ended with an error", { subscriber: this.name, channel: log.name, error: String(err) });
    });
    this.loops.set(log.name, loop);
  }

  /** @internal Stops every loop; resolves once no handler call is running. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.runner.stop();
    for (const w of this.wakers) w();
    this.wakers.clear();
    await Promise.all(this.loops.values());
  }

  private async run(log: ChannelLog): Promise<void> {
    const channel = log.name;
    let wake: (() => void) | null = null;
    const off = log.onCommit(() => wake?.());
    try {
      while (!this.stopped) {
        let cursor = this.state.cursors[channel]!;
        if (cursor < log.firstSeq) {
          const lost = log.firstSeq - cursor;
          this.host.cursors.addSkipped(this.state, channel, lost);
          this.host.logger.warn("retention removed messages before this subscriber read them", { subscriber: this.name, channel, skipped: lost });
          cursor = log.firstSeq;
          this.host.cursors.set(this.state, channel, cursor);
        } else if (cursor > log.nextSeq) {
          // Only after a crash under sync interval/none: the log lost its unsynced tail.
          this.host.logger.warn("cursor past the end of the log, moved back", { subscriber: this.name, channel, cursor, next_seq: log.nextSeq });
          cursor = log.nextSeq;
          this.host.cursors.set(this.state, channel, cursor);
        }
        const records = await log.read(cursor, READ_BATCH);
        if (records.length === 0) {
          await new Promise<void>((resolve) => {
            const done = () => {
              this.wakers.delete(done);
              wake = null;
              resolve();
            };
            wake = done;
            this.wakers.add(done);
            if (this.stopped || log.nextSeq > cursor) done();
          });
          continue;
        }
        for (const rec of records) {
          if (this.stopped) return;
          if (!(await this.runner.deliver(log, rec.seq, rec.body))) return;
          this.host.cursors.set(this.state, channel, rec.seq + 1);
        }
      }
    } finally {
      off();
    }
  }
}
