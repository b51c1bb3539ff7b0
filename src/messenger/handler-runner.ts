/**
 * Calls a handler with one stored message the way every handler
 * subscription does: decoded (and through its type's decoder), skipped when
 * expired, retried with backoff when the handler throws, and dead-lettered
 * after its retries. Used by a subscription's per-channel loops and by the
 * members of an in-process queue group alike.
 */
import { decodeEnvelope, type Message } from "../envelope/envelope.ts";
import { DecodeError } from "../errors.ts";
import { withContext } from "./context.ts";
import { RetryLater } from "./retry-later.ts";
import type { Logger } from "../observability/logger.ts";
import type { CursorStore } from "../store/cursor-store.ts";

/** A message handler; a throw (or rejection) means "failed, retry". */
export type Handler<T = unknown> = (msg: Message<T>) => void | Promise<void>;

/** What a handler subscription (or queue worker) needs from its messenger. */
export interface SubscriptionHost {
  readonly cursors: CursorStore;
  readonly logger: Logger;
  readonly retryBackoffBaseMs: number;
  readonly retryBackoffMaxMs: number;
  decoderFor(type: string): ((payload: unknown) => unknown) | undefined;
  /** Stores a dead letter for `msg`; throws when it could not be stored. */
  deadLetter(msg: Message, error: unknown, attempts: number): Promise<void>;
  /** Metrics: a handler call succeeded after `latencyMs` from publish. */
  noteDelivered(channel: string, latencyMs: number | undefined, redelivery: boolean): void;
  /** A message expired before the handler got it. */
  noteExpired(channel: string): void;
  noteFailed(channel: string): void;
}

/** The log a record was read from, as far as delivery needs it. */
export interface DeliveredFrom {
  readonly name: string;
  /** When `seq` was appended in this process (performance.now()), if it was. */
  appendedAt(seq: number): number | undefined;
}

/** Runs one subscriber's handler, one message at a time per caller. */
export class HandlerRunner {
  private readonly host: SubscriptionHost;
  private readonly name: string;
  private readonly handler: Handler<unknown>;
  private readonly serviceName: string | undefined;
  private readonly maxRetries: number;
  private readonly wakers = new Set<() => void>();
  private stopped = false;

  constructor(host: SubscriptionHost, name: string, handler: Handler<unknown>, serviceName: string | undefined, maxRetries: number) {
    this.host = host;
    this.name = name;
    this.handler = handler;
    this.serviceName = serviceName;
    this.maxRetries = maxRetries;
  }

  /** Ends retries and backoffs: a running `deliver` returns false once its handler call returns. */
  stop(): void {
    this.stopped = true;
    for (const w of this.wakers) w();
    this.wakers.clear();
  }

  /** Delivers one record with retries (or to the dead-letter channel); false when stopped before it was done. */
  async deliver(log: DeliveredFrom, seq: number, body: Uint8Array): Promise<boolean> {
    let msg: Message;
    try {
      msg = decodeEnvelope(body, seq);
    } catch (err) {
      // CRC-valid but not an envelope: written by something else. Never hand it to the handler.
      this.host.logger.error("record is not an envelope, skipped", { channel: log.name, seq, error: String(err) });
      return true;
    }
    if (msg.expires !== undefined && msg.expires <= Date.now()) {
      this.host.noteExpired(log.name);
      return true;
    }
    let attempts = 0;
    let retryLaters = 0;
    while (!this.stopped) {
      let delivered: Message = msg;
      const decode = this.host.decoderFor(msg.type);
      if (decode) {
        try {
          delivered = { ...msg, payload: decode(msg.payload) };
        } catch (err) {
          return this.toDeadLetter(msg, new DecodeError(`payload of type ${msg.type} failed its decoder: ${errText(err)}`, err), 1);
        }
      }
      try {
        const ctx = { serviceName: this.serviceName, correlationId: msg.correlationId ?? msg.id };
        await withContext(ctx, () => this.handler(delivered));
        const at = log.appendedAt(seq);
        this.host.noteDelivered(log.name, at !== undefined ? performance.now() - at : Date.now() - msg.ts, attempts + retryLaters > 0);
        return true;
      } catch (err) {
        if (err instanceof RetryLater) {
          retryLaters++;
          await this.sleep(err.delayMs ?? this.host.retryBackoffBaseMs);
          continue;
        }
        attempts++;
        this.host.noteFailed(log.name);
        this.host.logger.warn("handler failed", { subscriber: this.name, channel: log.name, seq, attempt: attempts, error: errText(err) });
        if (attempts >= this.maxRetries) return this.toDeadLetter(msg, err, attempts);
        await this.sleep(this.backoff(attempts));
      }
    }
    return false;
  }

  /** Dead-letters `msg`, retrying the store itself (e.g. disk full) until stopped. */
  private async toDeadLetter(msg: Message, error: unknown, attempts: number): Promise<boolean> {
    let tries = 0;
    while (!this.stopped) {
      try {
        await this.host.deadLetter(msg, error, attempts);
        return true;
      } catch (err) {
        tries++;
        this.host.logger.error("could not store dead letter, will retry", { channel: msg.channel, seq: msg.seq, error: errText(err) });
        await this.sleep(this.backoff(tries));
      }
    }
    return false;
  }

  private backoff(attempt: number): number {
    return Math.min(this.host.retryBackoffBaseMs * 2 ** (attempt - 1), this.host.retryBackoffMaxMs);
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.wakers.delete(done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.wakers.add(done);
    });
  }
}

function errText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
