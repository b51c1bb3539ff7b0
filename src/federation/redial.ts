/**
 * Dialling a hub again and again: one attempt at a time, a deadline for an
 * attempt to open a session, backoff with jitter between attempts, the
 * backoff reset after a connection that stayed up, cancellation by
 * AbortSignal. Links and ephemeral clients both run on it, so that a
 * restarted hub is not stormed by its whole fleet at once.
 */
import { HANDSHAKE_TIMEOUT_MS } from "./session.ts";

/** A connection is "healthy" (the backoff resets) after staying up this long. */
export const HEALTHY_AFTER_MS = 10_000;

/**
 * How long an attempt may take to open a session: the session's own
 * handshake limit, plus the TLS handshake before it. A connection that dies
 * before TLS verification ends no session and is given up here.
 */
export const ATTEMPT_DEADLINE_MS = HANDSHAKE_TIMEOUT_MS + 2_000;

/** `host:port` or `[v6]:port` split into its parts. */
export function splitHostPort(hp: string): { hostname: string; port: number } {
  const i = hp.lastIndexOf(":");
  return { hostname: hp.slice(0, i).replace(/^\[|\]$/g, ""), port: Number(hp.slice(i + 1)) };
}

/** Backoff delay for attempt `n` (from 1): base doubling to max, ± jitter. */
export function backoffDelay(n: number, baseMs: number, maxMs: number, jitter: number, rand = Math.random): number {
  const d = Math.min(maxMs, baseMs * 2 ** Math.max(0, n - 1));
  return Math.max(0, Math.round(d * (1 + jitter * (2 * rand() - 1))));
}

/** Time as the redialer sees it (injected in tests). */
export interface Clock {
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

const realClock: Clock = {
  now: () => Date.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (h) => clearTimeout(h as ReturnType<typeof setTimeout>),
};

/** What one attempt is handed. */
export interface AttemptControl {
  /** Call when the session opened: the deadline no longer applies, and its time up counts toward health. */
  opened(): void;
  /** Aborted when the attempt must give up: the deadline passed (reason says so) or the redialer stops. */
  readonly signal: AbortSignal;
}

/** How an attempt ended. */
export interface AttemptEnd {
  reason: string;
  /** False: do not dial again (a refusal for good, no reconnects wanted). */
  retry: boolean;
}

/** How a redialer paces its attempts. */
export interface RedialOptions {
  baseMs: number;
  maxMs: number;
  jitter: number;
  healthyAfterMs?: number;
  deadlineMs?: number;
  clock?: Clock;
  random?: () => number;
  /** Told before each wait between attempts. */
  onBackoff?: (delayMs: number, ended: AttemptEnd, attempt: number) => void;
}

/** Runs attempts one after another until one says not to retry or `signal` aborts. */
export class Redialer {
  private readonly opts: RedialOptions;
  private readonly clock: Clock;
  /** Attempts made since the last healthy connection (the backoff exponent). */
  attempt = 0;
  /** Attempts that followed an earlier one. */
  reconnects = 0;

  constructor(opts: RedialOptions) {
    this.opts = opts;
    this.clock = opts.clock ?? realClock;
  }

  /** Resolves with the last attempt's end once no more attempts are made. */
  async run(dial: (ctl: AttemptControl) => Promise<AttemptEnd>, signal: AbortSignal): Promise<AttemptEnd> {
    const { clock } = this;
    const healthyAfter = this.opts.healthyAfterMs ?? HEALTHY_AFTER_MS;
    let last: AttemptEnd = { reason: "stopped", retry: false };
    while (!signal.aborted) {
      const abort = new AbortController();
      const onStop = () => abort.abort("stopping");
      signal.addEventListener("abort", onStop, { once: true });
      let openedAt: number | null = null;
      const deadline = clock.setTimeout(() => openedAt === null && abort.abort("no session within the handshake time limit"), this.opts.deadlineMs ?? ATTEMPT_DEADLINE_MS);
      try {
        last = await dial({
          opened: () => {
            openedAt = clock.now();
            clock.clearTimeout(deadline);
          },
          signal: abort.signal,
        });
      } catch (err) {
        last = { reason: err instanceof Error ? err.message : String(err), retry: true };
      } finally {
        clock.clearTimeout(deadline);
        signal.removeEventListener("abort", onStop);
      }
      if (signal.aborted || !last.retry) return last;
      const healthy = openedAt !== null && clock.now() - openedAt > healthyAfter;
      this.attempt = healthy ? 1 : this.attempt + 1;
      this.reconnects++;
      const delay = backoffDelay(this.attempt, this.opts.baseMs, this.opts.maxMs, this.opts.jitter, this.opts.random);
      this.opts.onBackoff?.(delay, last, this.attempt);
      await this.sleep(delay, signal);
    }
    return last;
  }

  private sleep(ms: number, signal: AbortSignal): Promise<void> {
    return new Promise<void>((resolve) => {
      const done = () => {
        this.clock.clearTimeout(t);
        signal.removeEventListener("abort", done);
        resolve();
      };
      const t = this.clock.setTimeout(done, ms);
      signal.addEventListener("abort", done, { once: true });
    });
  }
}
