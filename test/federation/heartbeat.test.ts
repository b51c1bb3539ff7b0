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

  test("the side that answers pings only after two and a half periods without a frame, and is dead after three", () => {
    expect(heartbeatStep(2.5 * P - 1_000, 0, 0, P, true)).toEqual({ action: "none", nextInMs: 1_000 });
    expect(heartbeatStep(2.5 * P, 0, 0, P, true)).toEqual({ action: "ping", nextInMs: P / 2 + 1 });
    // Sending meanwhile (its own batches) it does not ping; the dead line stays where it was.
    expect(heartbeatStep(2.5 * P, 0, 2.5 * P - 10, P, true).action).toBe("none");
    expect(heartbeatStep(3 * P + 1, 0, 3 * P, P, true).action).toBe("dead");
  });

  test("a peer that stops is found dead at the same line on the side that answers, after its one ping", () => {
    let now = heartbeatStep(0, 0, 0, P, true).nextInMs;
    const actions: string[] = [];
    for (let i = 0; i < 5; i++) {
      const s = heartbeatStep(now, 0, 0, P, true);
      actions.push(s.action);
      if (s.action === "dead") break;
      now += s.nextInMs;
    }
    expect(actions).toEqual(["ping", "dead"]);
    expect(now).toBe(3 * P + 1);
  });

  // The dialer pings every period; each ping reaches the other side `transitMs` later, which
  // answers at once. Its timer is run the way an event loop runs it: a timer due at the
  // moment a ping is read fires first, in a wake-up of its own.
  function answeringSide(transitMs: number, periods: number) {
    let dialerSent = 0;
    let hubRecv = 0;
    let hubSent = 0;
    let arrival = -1;
    let hubNext = heartbeatStep(0, 0, 0, P, true).nextInMs;
    let dialerNext = heartbeatStep(0, 0, 0, P).nextInMs;
    const looks: number[] = [];
    let pings = 0;
    for (let now = 0; now < periods * P; now += 1) {
      if (now === hubNext) {
        const s = heartbeatStep(now, hubRecv, hubSent, P, true);
        expect(s.action).not.toBe("dead");
        if (s.action === "ping") pings++;
        looks.push(now);
        hubNext = now + s.nextInMs;
      }
      if (now === dialerNext) {
        const s = heartbeatStep(now, hubSent, dialerSent, P);
        expect(s.action).not.toBe("dead");
        if (s.action === "ping") {
          dialerSent = now;
          arrival = now + transitMs;
        }
        dialerNext = now + s.nextInMs;
      }
      if (now === arrival) {
        hubRecv = now;
        hubSent = now; // the PONG
      }
    }
    return { looks, pings };
  }

  test("a link whose dialer pings every period: the side that answers never pings, and looks once every two periods, between pings", () => {
    for (const transit of [0, 1, 5]) {
      const { looks, pings } = answeringSide(transit, 100);
      expect(pings).toBe(0);
      // One look every two periods, none where a ping is read (each would be a wake-up of its own).
      expect(looks.length).toBeLessThanOrEqual(51);
      for (const at of looks.slice(1)) {
        const phase = (at - transit) % P;
        expect(Math.min(phase, P - phase)).toBeGreaterThan(P / 4);
      }
    }
  });
});
