/**
 * One subscription of an MQTT session: a cursor reader of its durable (or
 * live-only) subscriber, drawing on the session's window, one message per
 * delivery. Records are read as stored (the payload's bytes and the MQTT
 * fields are found by scanning them, not by decoding the envelope).
 */
import { CursorReader, type Delivery as ReaderDelivery, STORED } from "../messenger/cursor-reader.ts";
import type { DurableSubscriber, StoredEnvelope } from "../messenger/durable-subscriber.ts";
import type { Window } from "../messenger/window.ts";

/** What a message sent to a client came from: a subscription of its own, or a shared subscription's group. */
export interface DeliverySource {
  /** The client acknowledged the delivery (or it was passed over): its reader's cursor may move. */
  acked(d: object): void;
  /** Kept while the client is away, with DUP marks per client (a shared group's are not: another member may get it). */
  readonly durable: boolean;
}

/** Which source, and which of its reader's deliveries, a message sent to the client came from. */
export interface SentFrom {
  subscription: DeliverySource;
  /** The source's own handle on what it sent (a reader's delivery, a queue group's). */
  delivery: object;
}

/** MQTT 5 subscription options (3.1.1: all off), kept with the subscription. */
export interface SubscriptionOptions {
  /** Granted QoS; a SUBSCRIBE to the same filter again may change it in place. */
  qos: 0 | 1 | 2;
  /** Not the client's own publishes. */
  noLocal: boolean;
  /** The RETAIN flag as published, not cleared on live messages. */
  retainAsPublished: boolean;
  /** Subscription identifier sent with every message it matches (0: none). */
  id: number;
}

/** What a subscription needs of its session. */
export interface SubscriptionOwner {
  /** QoS 1 and 2 messages in flight to the client, over every subscription and retained messages. */
  readonly window: Window;
  /** Whether the logged-in user may receive messages of `channel`. */
  mayReceive(channel: string): boolean;
  /**
   * Sends one stored record to the client, or passes over it; when it is
   * sent at QoS 1 or 2 the session acknowledges `from` on the client's ack,
   * and returns true; false: done with it now (sent at QoS 0, or passed over).
   */
  deliver(r: StoredEnvelope, from: SentFrom, sub: MqttSubscription): boolean;
  /** Resolves when the client's socket has room again. */
  writable(): Promise<void>;
  /** Whether `writable()` would wait now. */
  behind(): boolean;
  /** Ends the session after an internal failure. */
  fail(reason: string): void;
}

/**
 * One subscription of a session: a cursor reader of its durable subscriber,
 * drawing on the session's window (the receive maximum spans every
 * subscription), one message per delivery.
 */
export class MqttSubscription implements DeliverySource {
  /** The keyop pattern it reads (one MQTT filter may map to two). */
  readonly pattern: string;
  /** The MQTT filter it was made for. */
  readonly filter: string;
  options: SubscriptionOptions;
  private readonly reader: CursorReader<StoredEnvelope>;
  private readonly session: SubscriptionOwner;
  /** A durable subscriber (kept while the client is away), not a live-only one. */
  readonly durable: boolean;

  constructor(session: SubscriptionOwner, sub: DurableSubscriber, pattern: string, filter: string, options: SubscriptionOptions, durable: boolean) {
    this.durable = durable;
    this.session = session;
    this.pattern = pattern;
    this.filter = filter;
    this.options = options;
    this.reader = new CursorReader(sub, { form: STORED, window: session.window, unit: "record", maxRecords: 500 });
  }

  get qos(): 0 | 1 | 2 {
    return this.options.qos;
  }

  start(): void {
    const deliver = (ds: ReaderDelivery<StoredEnvelope>[]) => {
      for (const d of ds) {
        const r = d.records[0]!;
        // Outside the user's subscribe rules: passed over, as a hub passes over what a peer may not get.
        if (!this.session.mayReceive(r.channel) || !this.session.deliver(r, { subscription: this, delivery: d }, this)) this.reader.ack(d);
      }
    };
    // A client that reads slower than messages come (QoS 0 has no window) holds its delivery here.
    const ready = () => (this.session.behind() ? this.session.writable() : undefined);
    this.reader.run(deliver, ready).catch((err) => this.session.fail(`delivery failed: ${String(err)}`));
  }

  /** The client acknowledged `d` (or it was passed over): the cursor moves past every acknowledged prefix. */
  acked(d: object): void {
    this.reader.ack(d as ReaderDelivery<StoredEnvelope>);
  }

  stop(): void {
    this.reader.stop();
  }

  get subscriber(): DurableSubscriber {
    return this.reader.sub;
  }
}
