import { describe, expect, test } from "bun:test";
import { type AttemptControl, type AttemptEnd, backoffDelay, type Clock, Redialer } from "../../src/federation/redial.ts";

/** Time that moves only when told to. */
class FakeClock implements Clock {
  private t = 0;
  private nextId = 1;
  private timers = new Map<number, { at: number; fn: () => void }>();

  now(): number {
    return this.t;
  }
  setTimeout(fn: () => void, ms: number): unknown {
    const id = this.nextId++;
    this.timers.set(id, { at: this.t + ms, fn });
    return id;
  }
  clearTimeout(h: unknown): void {
    this.timers.delete(h as number);
  }
  /** Timers due within `ms` fire in order, each followed by whatever their callbacks set off. */
  async advance(ms: number): Promise<void> {
    const end = this.t + ms;
    for (;;) {
      await settle();
      const due = [...this.timers.entries()].filter(([, x]) => x.at <= end).sort((a, b) => a[1].at - b[1].at)[0];
      if (!due) break;
      this.timers.delete(due[0]);
      this.t = due[1].at;
      due[1].fn();
    }
    this.t = end;
    await settle();
  }
}

const settle = () => new Promise<void>((r) => setImmediate(r));

/** A dial function that records each attempt and lets the test end it. */
function dialer() {
  const attempts: { ctl: AttemptControl; end: (e: AttemptEnd) => void; aborted: string | null }[] = [];
  const dial = (ctl: AttemptControl) =>
    new Promise<AttemptEnd>((resolve) => {
      const a = { ctl, end: resolve, aborted: null as string | null };
      ctl.signal.addEventListener("abort", () => {
        a.aborted = String(ctl.signal.reason);
        resolve({ reason: a.aborted, retry: true });
      });
      attempts.push(a);
    });
  return { attempts, dial };
}

describe("backoffDelay", () => {
  test("doubles from base to max; jitter spreads it both ways by the injected random", () => {
    expect([1, 2, 3, 4, 5, 6, 7, 8].map((n) => backoffDelay(n, 500, 30_000, 0.2, () => 0.5))).toEqual([500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
    expect(backoffDelay(3, 500, 30_000, 0.2, () => 0)).toBe(1600);
    expect(backoffDelay(3, 500, 30_000, 0.2, () => 1)).toBe(2400);
  });
});

describe("Redialer", () => {
  const opts = (clock: FakeClock, delays: number[]) => ({
    baseMs: 100,
    maxMs: 1000,
    jitter: 0,
    clock,
    random: () => 0.5,
    healthyAfterMs: 5_000,
    deadlineMs: 2_000,
    onBackoff: (d: number) => void delays.push(d),
  });

  test("attempts that fail back off 100, 200, 400 ... up to the max, one attempt at a time", async () => {
    const clock = new FakeClock();
    const delays: number[] = [];
    const { attempts, dial } = dialer();
    const stop = new AbortController();
    const done = new Redialer(opts(clock, delays)).run(dial, stop.signal);
    for (let i = 0; i < 6; i++) {
      await clock.advance(0);
      expect(attempts.length).toBe(i + 1);
      attempts[i]!.end({ reason: "refused", retry: true });
      await clock.advance(0);
      // Nothing is dialled again before the delay has passed.
      await clock.advance(delays[i]! - 1);
      expect(attempts.length).toBe(i + 1);
      await clock.advance(1);
    }
    expect(delays).toEqual([100, 200, 400, 800, 1000, 1000]);
    stop.abort();
    expect((await done).reason).toBe("stopping");
  });

  test("a connection that stayed up past healthyAfter resets the backoff; a short one does not", async () => {
    const clock = new FakeClock();
    const delays: number[] = [];
    const { attempts, dial } = dialer();
    const stop = new AbortController();
    const done = new Redialer(opts(clock, delays)).run(dial, stop.signal);
    for (const upMs of [0, 0, 6_000, 10]) {
      await clock.advance(0);
      const a = attempts.at(-1)!;
      a.ctl.opened();
      await clock.advance(upMs);
      a.end({ reason: "dropped", retry: true });
      await clock.advance(0);
      await clock.advance(delays.at(-1)!);
    }
    expect(delays).toEqual([100, 200, 100, 200]);
    stop.abort();
    await done;
  });

  test("an attempt that opens no session is aborted at the deadline; one that opened is not", async () => {
    const clock = new FakeClock();
    const delays: number[] = [];
    const { attempts, dial } = dialer();
    const stop = new AbortController();
    const done = new Redialer(opts(clock, delays)).run(dial, stop.signal);
    await clock.advance(1_999);
    expect(attempts[0]!.aborted).toBeNull();
    await clock.advance(1);
    expect(attempts[0]!.aborted).toBe("no session within the handshake time limit");
    await clock.advance(100);
    expect(attempts.length).toBe(2);
    attempts[1]!.ctl.opened();
    await clock.advance(10_000);
    expect(attempts[1]!.aborted).toBeNull();
    stop.abort();
    expect(attempts[1]!.aborted).toBe("stopping");
    await done;
  });

  test("stopping during the wait between attempts ends at once; an attempt that says not to retry ends the run", async () => {
    const clock = new FakeClock();
    const delays: number[] = [];
    const { attempts, dial } = dialer();
    const stop = new AbortController();
    const r = new Redialer(opts(clock, delays));
    let ended = false;
    const done = r.run(dial, stop.signal).then((e) => ((ended = true), e));
    await clock.advance(0);
    attempts[0]!.end({ reason: "refused", retry: true });
    await clock.advance(50); // halfway through the 100 ms wait
    stop.abort();
    await settle();
    expect(ended).toBe(true);
    expect(attempts.length).toBe(1);

    const again = dialer();
    const last = new Redialer(opts(new FakeClock(), [])).run(async (ctl) => {
      again.attempts.push({ ctl, end: () => {}, aborted: null });
      return { reason: "refused for good", retry: false };
    }, new AbortController().signal);
    expect(await last).toEqual({ reason: "refused for good", retry: false });
    expect(again.attempts.length).toBe(1);
    await done;
  });
});
