/**
 * A handler's way to say "not now": thrown from a handler, it keeps the
 * subscriber's place and retries the same message later without spending one
 * of its `max_retries` (e.g. a downstream device is still booting).
 */
export class RetryLater extends Error {
  /** Delay before the retry in ms; the retry backoff base when omitted. */
  readonly delayMs: number | undefined;
  constructor(delayMs?: number, message = "retry later") {
    super(message);
    this.name = "RetryLater";
    this.delayMs = delayMs;
  }
}
