/**
 * One subscription of an MQTT session: a cursor reader of its durable (or
 * live-only) subscriber, drawing on the session's window, one message per
 * delivery.
 */
import type { Message } from "../envelope/envelope.ts";
import { CursorReader, type Delivery as ReaderDelivery, MESSAGES } from "../messenger/cursor-reader.ts";
import type { DurableSubscriber } from "../messenger/durable-subscriber.ts";
import type { Window } from "../messenger/window.ts";

/** Which subscription, and which of its reader's deliveries, a message sent to the client came from. */
export interface SentFrom {
  subscription: MqttSubscription;
  delivery: ReaderDelivery<Message>;
}

/** What a subscription needs of its session. */
export interface SubscriptionOwner {
  /** QoS 1 messages in flight to the client, over every subscription and retained messages. */
  readonly window: Window;
  /** Whether the logged-in user may receive messages of `channel`. */
  mayReceive(channel: string): boolean;
  /** Sends one stored message to the client (QoS 1: `from` is acknowledged when the client acks). */
  deliver(m: Message, qos: 0 | 1, from: SentFrom | null): void;
  /** Resolves when the client's socket has room again. */
  writable(): Promise<void>;
  /** Ends the session after an internal failure. */
  fail(reason: string): void;
}

/**
 * One subscription of a session: a cursor reader of its durable subscriber,
 * drawing on the session's window (the receive maximum spans every
 * subscription), one message per delivery.
 */
export class MqttSubscription {
  readonly pattern: string;
  /** Granted QoS; a SUBSCRIBE to the same filter again may change it in place. */
  qos: 0 | 1;
  private readonly reader: CursorReader<Message>;
  private readonly session: SubscriptionOwner;
  /** A durable subscriber (kept while the client is away), not a live-only one. */
  readonly durable: boolean;

  constructor(session: SubscriptionOwner, sub: DurableSubscriber, pattern: string, qos: 0 | 1, durable: boolean) {
    this.durable = durable;
    this.session = session;
    this.pattern = pattern;
    this.qos = qos;
    this.reader = new CursorReader(sub, { form: MESSAGES, window: session.window, unit: "record", maxRecords: 500 });
  }

  start(): void {
    void this.run().catch((err) => this.session.fail(`delivery failed: ${String(err)}`));
  }

  private async run(): Promise<void> {
    for (;;) {
      const ds = await this.reader.next();
      if (ds === null) return;
      for (const d of ds) {
        const m = d.records[0]!;
        if (!this.session.mayReceive(m.channel)) {
          // Outside the user's subscribe rules: passed over, as a hub passes over what a peer may not get.
          this.reader.ack(d);
        } else if (this.qos === 0) {
          this.session.deliver(m, 0, null);
          this.reader.ack(d);
        } else {
          this.session.deliver(m, 1, { subscription: this, delivery: d });
        }
      }
      // A client that reads slower than messages come (QoS 0 has no window) holds its delivery here.
      await this.session.writable();
    }
  }

  /** The client acknowledged `d` (or it was passed over): the cursor moves past every acknowledged prefix. */
  acked(d: ReaderDelivery<Message>): void {
    this.reader.ack(d);
  }

  stop(): void {
    this.reader.stop();
  }

  get subscriber(): DurableSubscriber {
    return this.reader.sub;
  }
}
