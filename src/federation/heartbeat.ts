/**
 * When a federation session must act on the quiet of its link: a pure
 * function of the clock, so the session needs one timer armed for exactly
 * the next moment anything is due, not a tick every quarter period. An idle
 * link then wakes its agent about once per heartbeat period, which is what
 * an idle board pays for a link.
 */

/** What is due at `now`, and when to look again. */
export interface HeartbeatStep {
  /** "dead": nothing from the peer for three periods; "ping": nothing sent for one period. */
  action: "dead" | "ping" | "none";
  /** Milliseconds until the next check (after a ping, counted from the ping). */
  nextInMs: number;
}

/** The shortest wait between checks: a clock that jumps does not make the timer spin. */
const MIN_WAIT_MS = 25;

export function heartbeatStep(now: number, lastRecv: number, lastSent: number, periodMs: number): HeartbeatStep {
  const deadAt = lastRecv + 3 * periodMs;
  if (now > deadAt) return { action: "dead", nextInMs: 0 };
  const ping = now - lastSent >= periodMs;
  const sent = ping ? now : lastSent;
  // Checked just after the dead line, so that a peer that is gone is found when it is due.
  const next = Math.min(sent + periodMs, deadAt + 1);
  return { action: ping ? "ping" : "none", nextInMs: Math.max(MIN_WAIT_MS, next - now) };
}
