/**
 * Requests waiting for their reply. A request carries `reply_to`, an inbox
 * channel `_inbox.<uuid>` that names nothing in any log: a reply published
 * to it is handed to the waiting request here and never stored, so replies
 * pin no retention and reach nobody but their requester.
 */
import type { Message } from "../envelope/envelope.ts";
import { RequestTimeoutError } from "../errors.ts";

/** First token of every inbox channel. */
export const INBOX_PREFIX = "_inbox.";

/** Whether `channel` is an inbox (a reply's destination, never a log). */
export function isInbox(channel: string): boolean {
  return channel.startsWith(INBOX_PREFIX);
}

/** A fresh inbox channel, unguessable. */
export function newInbox(): string {
  return `${INBOX_PREFIX}${Bun.randomUUIDv7()}`;
}

interface Waiter {
  resolve: (m: Message) => void;
  reject: (e: unknown) => void;
  timer: ReturnType<typeof setTimeout>;
}

/** The requests of one messenger that wait for a reply, by inbox. */
export class Inboxes {
  private readonly waiting = new Map<string, Waiter>();
  /** Replies that came for no request that waits (timed out, or answered already). */
  dropped = 0;

  /** Waits for the reply to `inbox`; rejects with `RequestTimeoutError` after `timeoutMs`. */
  wait(inbox: string, timeoutMs: number, what: string): Promise<Message> {
    return new Promise<Message>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(inbox);
        reject(new RequestTimeoutError(`no reply to the request on ${what} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiting.set(inbox, { resolve, reject, timer });
    });
  }

  /** Whether a request waits on `inbox` here. */
  waits(inbox: string): boolean {
    return this.waiting.has(inbox);
  }

  /** Hands `reply` to the request waiting on `inbox`; false when none waits. */
  deliver(inbox: string, reply: Message): boolean {
    const w = this.waiting.get(inbox);
    if (!w) return false;
    this.waiting.delete(inbox);
    clearTimeout(w.timer);
    w.resolve(reply);
    return true;
  }

  /** Ends a wait with `err` (the request could not be sent). */
  fail(inbox: string, err: unknown): void {
    const w = this.waiting.get(inbox);
    if (!w) return;
    this.waiting.delete(inbox);
    clearTimeout(w.timer);
    w.reject(err);
  }

  /** Requests waiting now. */
  get size(): number {
    return this.waiting.size;
  }

  /** Ends every wait with `err` (the messenger closes). */
  failAll(err: unknown): void {
    for (const inbox of [...this.waiting.keys()]) this.fail(inbox, err);
  }
}
