/**
 * Dialling a hub: parsing its address and pacing reconnects. Shared by links
 * (federation.ts) and ephemeral clients (ephemeral.ts), which must back off
 * the same way so that a restarted hub is not stormed by its whole fleet.
 */

/** A connection is "healthy" (the backoff resets) after staying up this long. */
export const HEALTHY_AFTER_MS = 10_000;

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
