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
});
