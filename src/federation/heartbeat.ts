/**
 * When a federation session must act on the quiet of its link: a pure
 * function of the clock, so the session needs one timer armed for exactly
 * the next moment anything is due, not a tick every quarter period. An idle
 * link then wakes its agent about once per heartbeat period, which is what
 * an idle board pays for a link.
 *
 * The side that dialed keeps the link alive: it pings after a period in
 * which it sent nothing, and the other side answers. The side that
 * answers (the hub) pings only after two and a half periods in which it
 * heard nothing, which a peer that pings never lets happen: one PING and one PONG
 * a period on an idle link instead of up to two of each, and a hub with
 * many quiet links is woken by their pings, not by a timer of its own per
 * link every period.
 */

/** What is due at `now`, and when to look again. */
export interface HeartbeatStep {
  /** "dead": nothing from the peer for three periods; "ping": time to ask the peer for a frame. */
  action: "dead" | "ping" | "none";
  /** Milliseconds until the next check (after a ping, counted from the ping). */
  nextInMs: number;
}

/** The shortest wait between checks: a clock that jumps does not make the timer spin. */
const MIN_WAIT_MS = 25;

/**
 * The step at `now` for a side that last heard from its peer at
 * `lastRecv` and last sent at `lastSent`. `answers`: the side that was
 * dialed (it pings only after two quiet periods; see above).
 */
export function heartbeatStep(now: number, lastRecv: number, lastSent: number, periodMs: number, answers = false): HeartbeatStep {
  const deadAt = lastRecv + 3 * periodMs;
  if (now > deadAt) return { action: "dead", nextInMs: 0 };
  // Checked just after the dead line, so that a peer that is gone is found when it is due.
  if (answers) {
    // Looked at half a period past the two quiet periods, not on them: that line is when the
    // dialer's next ping arrives, and a timer due on it fires just before the ping's read, a
    // wake-up of its own every period. Half a period later the look finds the ping read and
    // moves on two periods: one look every two periods, between pings. The dead line is the same.
    const lookAt = lastRecv + 2 * periodMs + periodMs / 2;
    if (now < lookAt) return { action: "none", nextInMs: Math.max(MIN_WAIT_MS, lookAt - now) };
  }
  const ping = now - lastSent >= periodMs;
  const sent = ping ? now : lastSent;
  const next = Math.min(sent + periodMs, deadAt + 1);
  return { action: ping ? "ping" : "none", nextInMs: Math.max(MIN_WAIT_MS, next - now) };
}
