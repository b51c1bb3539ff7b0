import { describe, expect, test } from "bun:test";
import { LaneScheduler, type LaneClock } from "../../src/federation/lanes.ts";
import { compilePriorities, DEFAULT_PRIORITY, laneWeight } from "../../src/federation/priority.ts";
import { TokenBucket } from "../../src/federation/token-bucket.ts";

/** A clock the test moves by hand; timers run when it passes them. */
class FakeClock implements LaneClock {
  t = 0;
  private timers: { at: number; fn: () => void; id: number }[] = [];
  private ids = 0;
  now = () => this.t;
  setTimer = (fn: () => void, ms: number) => {
    const id = ++this.ids;
    this.timers.push({ at: this.t + ms, fn, id });
    return id;
  };
  clearTimer = (id: unknown) => {
    this.timers = this.timers.filter((x) => x.id !== id);
  };
  advance(ms: number): void {
    const end = this.t + ms;
    for (;;) {
      this.timers.sort((a, b) => a.at - b.at);
      const next = this.timers[0];
      if (!next || next.at > end) break;
      this.timers.shift();
      this.t = next.at;
      next.fn();
    }
    this.t = end;
  }
}

/** A frame whose first byte names its lane, `size` bytes long. */
const frame = (tag: number, size: number) => new Uint8Array(size).fill(tag);

function sink() {
  const sent: Uint8Array[] = [];
  return { sent, out: { send: (f: Uint8Array) => (sent.push(f), true), writable: () => Promise.resolve() } };
}

describe("TokenBucket", () => {
  test("a frame may go while the bucket is not in debt, and the debt is paid at the rate", () => {
    const b = new TokenBucket(1000, 500, 0);
    expect(b.waitMs(0)).toBe(0);
    b.take(1500, 0); // 500 saved, 1000 of debt
    expect(b.waitMs(0)).toBe(1000);
    expect(b.waitMs(400)).toBeCloseTo(600);
    expect(b.waitMs(1000)).toBe(0);
    // idle for long: no more than the burst is saved
    b.take(100, 1000);
    expect(b.waitMs(10_000)).toBe(0);
    b.take(600, 10_000);
    expect(b.waitMs(10_000)).toBeCloseTo(100);
  });

  test("refuses a rate or burst that is not positive", () => {
    expect(() => new TokenBucket(0, 1, 0)).toThrow();
    expect(() => new TokenBucket(1, 0, 0)).toThrow();
  });
});

describe("priorities", () => {
  test("the first matching rule names the lane; others get the default", () => {
    const laneOf = compilePriorities([
      { pattern: "alarm.>", priority: 0 },
      { pattern: "telemetry.>", priority: 6 },
      { pattern: ">", priority: 2 },
    ]);
    expect(laneOf("alarm.fire")).toBe(0);
    expect(laneOf("telemetry.temp")).toBe(6);
    expect(laneOf("other")).toBe(2);
    expect(compilePriorities([{ pattern: "a", priority: 1 }])("b")).toBe(DEFAULT_PRIORITY);
  });

  test("each step up doubles a lane's weight", () => {
    expect(laneWeight(0) / laneWeight(DEFAULT_PRIORITY)).toBe(16);
    expect(laneWeight(6) * 2).toBe(laneWeight(5));
  });
});

describe("LaneScheduler", () => {
  test("without a cap or a queue a frame is written at once", async () => {
    const { sent, out } = sink();
    const s = new LaneScheduler(out);
    s.push(4, frame(1, 10));
    expect(sent).toHaveLength(1);
    await s.idle();
  });

  test("a frame asked to go now is handed over with `now` only when nothing waits before it", () => {
    const clock = new FakeClock();
    const calls: { tag: number; now: boolean }[] = [];
    const out = { send: (f: Uint8Array, now?: boolean) => (calls.push({ tag: f[0]!, now: now === true }), true), writable: () => Promise.resolve() };
    const s = new LaneScheduler(out, { bucket: new TokenBucket(1000, 150, 0), clock });
    s.push(4, frame(1, 100), true);
    s.push(4, frame(2, 100)); // the burst still allows it: straight to the session, at the end of the turn
    expect(calls).toEqual([
      { tag: 1, now: true },
      { tag: 2, now: false },
    ]);
    s.push(4, frame(3, 100), true); // the cap holds it back: it waits in its lane
    expect(calls).toHaveLength(2);
    clock.advance(1000);
    // From the lane it goes with the rest of its turn, not on its own.
    expect(calls[2]).toEqual({ tag: 3, now: false });
  });

  test("a higher lane overtakes a backlog held back by the cap; order within a lane is kept", () => {
    const clock = new FakeClock();
    const { sent, out } = sink();
    const s = new LaneScheduler(out, { bucket: new TokenBucket(1000, 50, 0), clock });
    for (let i = 0; i < 10; i++) s.push(4, frame(40 + i, 100)); // a backlog: 1 s at the cap
    expect(sent).toHaveLength(1);
    clock.advance(250);
    const before = sent.length;
    s.push(0, frame(1, 100));
    clock.advance(100); // the next slot
    expect(sent.length).toBe(before + 1);
    expect(sent.at(-1)![0]).toBe(1);
    clock.advance(10_000);
    const telemetry = sent.filter((f) => f[0] !== 1).map((f) => f[0]);
    expect(telemetry).toEqual([40, 41, 42, 43, 44, 45, 46, 47, 48, 49]);
  });

  test("the cap holds: bytes written over time stay at the rate", () => {
    const clock = new FakeClock();
    const { sent, out } = sink();
    const s = new LaneScheduler(out, { bucket: new TokenBucket(10_000, 1000, 0), clock });
    for (let i = 0; i < 500; i++) s.push(4, frame(4, 500));
    clock.advance(10_000);
    const bytes = sent.reduce((n, f) => n + f.length, 0);
    // 10 s at 10,000 B/s, plus the burst and one frame
    expect(bytes).toBeGreaterThanOrEqual(100_000);
    expect(bytes).toBeLessThanOrEqual(101_500);
  });

  test("busy lanes share the link by weight; the lower one is not starved", () => {
    const clock = new FakeClock();
    const { sent, out } = sink();
    const s = new LaneScheduler(out, { bucket: new TokenBucket(10_000, 100, 0), clock });
    for (let i = 0; i < 2000; i++) {
      s.push(0, frame(0, 100));
      s.push(4, frame(4, 100));
    }
    clock.advance(17_000);
    const high = sent.filter((f) => f[0] === 0).length;
    const low = sent.filter((f) => f[0] === 4).length;
    expect(low).toBeGreaterThan(0);
    expect(high / low).toBeGreaterThan(14);
    expect(high / low).toBeLessThan(18);
  });

  test("idle() waits for the queue to empty and for the session to take more", async () => {
    let release: () => void = () => {};
    const sent: Uint8Array[] = [];
    let full = true;
    const s = new LaneScheduler({
      send: (f) => (sent.push(f), !full),
      writable: () => new Promise<void>((r) => (release = r)),
    });
    s.push(4, frame(1, 10));
    s.push(4, frame(2, 10));
    expect(sent).toHaveLength(1);
    let idle = false;
    const waiting = s.idle().then(() => (idle = true));
    await Promise.resolve();
    expect(idle).toBe(false);
    full = false;
    release();
    await waiting;
    expect(sent.map((f) => f[0])).toEqual([1, 2]);
  });

  test("stop drops what is queued and releases waiters", async () => {
    const clock = new FakeClock();
    const { sent, out } = sink();
    const s = new LaneScheduler(out, { bucket: new TokenBucket(100, 10, 0), clock });
    s.push(4, frame(1, 50));
    s.push(4, frame(2, 50));
    const waiting = s.idle();
    s.stop();
    await waiting;
    clock.advance(10_000);
    expect(sent).toHaveLength(1);
    expect(s.stats()[0]!.queuedFrames).toBe(0);
  });
});
