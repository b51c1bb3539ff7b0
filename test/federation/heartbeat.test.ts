/** The heartbeat schedule: what is due when, from the clock alone. */
import { describe, expect, test } from "bun:test";
import { heartbeatStep } from "../../src/federation/heartbeat.ts";

const P = 10_000;

describe("heartbeatStep", () => {
  test("a quiet link pings once a period and is looked at again one period after the ping", () => {
    expect(heartbeatStep(P, 0, 0, P)).toEqual({ action: "ping", nextInMs: P });
  });

  test("while frames go out, nothing is sent; the next look is when a ping would be due", () => {
    expect(heartbeatStep(5_000, 4_000, 3_000, P)).toEqual({ action: "none", nextInMs: 8_000 });
  });

  test("nothing from the peer for three periods: dead, whatever was sent", () => {
    expect(heartbeatStep(3 * P + 1, 0, 3 * P, P).action).toBe("dead");
    expect(heartbeatStep(3 * P, 0, 3 * P, P).action).not.toBe("dead");
  });

  test("the look after the last ping before the dead line falls just past the line, not a period later", () => {
    // Last heard at 0, sending every period: the ping at 25 s is followed by a look at 30 s + 1.
    const s = heartbeatStep(25_000, 0, 15_000, P);
    expect(s.action).toBe("ping");
    expect(25_000 + s.nextInMs).toBe(3 * P + 1);
    expect(heartbeatStep(3 * P + 1, 0, 25_000, P).action).toBe("dead");
  });

  test("an idle link is looked at about once a period, never in a tight loop", () => {
    let lastSent = 0;
    let now = 0;
    let looks = 0;
    // The peer answers every ping at once (lastRecv = the ping).
    while (now < 100 * P) {
      const s = heartbeatStep(now, lastSent, lastSent, P);
      expect(s.action).not.toBe("dead");
      if (s.action === "ping") lastSent = now;
      expect(s.nextInMs).toBeGreaterThanOrEqual(25);
      now += s.nextInMs;
      looks++;
    }
    expect(looks).toBeLessThanOrEqual(101);
  });

  test("the side that answers pings only after two periods without a frame, and is dead after three", () => {
    expect(heartbeatStep(2 * P - 1_000, 0, 0, P, true)).toEqual({ action: "none", nextInMs: 1_000 });
    expect(heartbeatStep(2 * P, 0, 0, P, true)).toEqual({ action: "ping", nextInMs: P });
    // Sending meanwhile (its own batches) it does not ping; the dead line stays where it was.
    expect(heartbeatStep(2 * P, 0, 2 * P - 10, P, true).action).toBe("none");
    expect(heartbeatStep(3 * P + 1, 0, 3 * P, P, true).action).toBe("dead");
  });

  test("a link whose dialer pings every period: the side that answers never pings, and looks less than once a period", () => {
    // The dialer pings at every period (its send clock: only its pings); the other side answers each at once.
    let dialerSent = 0;
    let hubRecv = 0;
    let hubSent = 0;
    let hubNext = heartbeatStep(0, 0, 0, P, true).nextInMs;
    let dialerNext = heartbeatStep(0, 0, 0, P).nextInMs;
    let hubLooks = 0;
    let hubPings = 0;
    for (let now = 0; now < 100 * P; now += 1) {
      if (now === dialerNext) {
        const s = heartbeatStep(now, hubSent, dialerSent, P);
        expect(s.action).not.toBe("dead");
        if (s.action === "ping") {
          dialerSent = now;
          hubRecv = now; // the ping arrives
          hubSent = now; // the PONG
        }
        dialerNext = now + s.nextInMs;
      }
      if (now === hubNext) {
        const s = heartbeatStep(now, hubRecv, hubSent, P, true);
        expect(s.action).toBe("none");
        if (s.action === "ping") hubPings++;
        hubLooks++;
        hubNext = now + s.nextInMs;
      }
    }
    expect(hubPings).toBe(0);
    expect(hubLooks).toBeLessThanOrEqual(70);
  });
});
