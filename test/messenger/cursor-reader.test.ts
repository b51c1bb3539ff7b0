import { describe, expect, test } from "bun:test";
import { CursorReader, MESSAGES } from "../../src/messenger/cursor-reader.ts";
import { Messenger } from "../../src/messenger/messenger.ts";
import { Window } from "../../src/messenger/window.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { tmpDir, waitFor } from "../helpers.ts";

const open = (tailCacheBytes?: number) => Messenger.open({ storage: { dataDir: tmpDir(), tailCacheBytes }, logger: silentLogger });
const seqs = (ds: { records: { seq: number }[] }[] | null) => (ds ?? []).flatMap((d) => d.records.map((r) => r.seq));

describe("CursorReader", () => {
  test("a window of records: a run takes one unit per record, and a cumulative ack in the middle of a run gives back what it passed", async () => {
    const m = await open();
    for (let i = 0; i < 6; i++) await m.publish("c.w", "t", i);
    const window = new Window(3);
    const r = new CursorReader(m.openSubscriber("c.w", "s", { from: "earliest" }), { form: MESSAGES, window, unit: "run", windowCounts: "records", maxRecords: 100 });
    const first = await r.next({ idleMs: 0 });
    expect(first?.length).toBe(1);
    expect(seqs(first)).toEqual([1, 2, 3]);
    expect([window.room(), r.inflight]).toEqual([0, 3]);
    expect(await r.next({ idleMs: 20 })).toEqual([]);
    r.ackThrough("c.w", 2);
    expect([window.room(), r.inflight]).toEqual([2, 1]);
    expect(seqs(await r.next({ idleMs: 0 }))).toEqual([4, 5]);
    r.ackThrough("c.w", 5);
    expect(seqs(await r.next({ idleMs: 0 }))).toEqual([6]);
    r.stop();
    await m.close();
  });

  test("after stop an acknowledgement gives its room back and leaves the cursor alone", async () => {
    const m = await open();
    for (let i = 0; i < 2; i++) await m.publish("c.s", "t", i);
    const window = new Window(2);
    const sub = m.openSubscriber("c.s", "s", { from: "earliest" });
    const r = new CursorReader(sub, { form: MESSAGES, window, unit: "record", maxRecords: 100 });
    const ds = (await r.next({ idleMs: 0 }))!;
    expect(seqs(ds)).toEqual([1, 2]);
    expect(window.room()).toBe(0);
    r.stop();
    r.ack(ds[1]!);
    r.ack(ds[0]!);
    expect(window.room()).toBe(2);
    expect(sub.cursorOf("c.s")).toBe(1);
    // A delivery of another reader is not this one's to acknowledge.
    const other = new CursorReader(m.openSubscriber("c.s", "t", { from: "earliest" }), { form: MESSAGES, window: new Window(5), unit: "record", maxRecords: 100 });
    const mine = (await other.next({ idleMs: 0 }))!;
    r.ack(mine[0]!);
    expect(other.inflight).toBe(2);
    other.stop();
    await m.close();
  });

  test("a window shared by two readers: room one frees wakes the other", async () => {
    const m = await open();
    const window = new Window(1);
    const a = new CursorReader(m.openSubscriber("c.a", "s", { from: "earliest" }), { form: MESSAGES, window, unit: "record", maxRecords: 10 });
    const b = new CursorReader(m.openSubscriber("c.b", "s", { from: "earliest" }), { form: MESSAGES, window, unit: "record", maxRecords: 10 });
    await m.publish("c.a", "t", 1);
    await m.publish("c.b", "t", 1);
    const da = (await a.next({ idleMs: 0 }))!;
    expect(da.length).toBe(1);
    const waiting = b.next({ idleMs: 5_000 });
    a.ack(da[0]!);
    expect(seqs(await waiting)).toEqual([1]);
    a.stop();
    b.stop();
    await m.close();
  });

  for (const [what, cache] of [
    ["from memory", undefined],
    ["from disk (no tail cache)", 0],
  ] as const) {
    test(`run ${what}: every record pushed once in order, never past the window, and the promise settles on stop`, async () => {
      const m = await open(cache);
      const window = new Window(4);
      const sub = m.openSubscriber("c.r", "s", { from: "earliest" });
      for (let i = 0; i < 10; i++) await m.publish("c.r", "t", i);
      const r = new CursorReader(sub, { form: MESSAGES, window, unit: "record", maxRecords: 3 });
      const got: number[] = [];
      const held: Parameters<typeof r.ack>[0][] = [];
      let most = 0;
      const ended = r.run(
        (ds) => {
          for (const d of ds) {
            got.push(...d.records.map((x) => x.seq));
            held.push(d);
          }
          most = Math.max(most, r.inflight);
        },
        () => undefined,
      );
      await waitFor(() => got.length === 4, "the first window");
      // The consumer acknowledges: the reader pushes more at once, with no wait of its own.
      const ackUntil = async (n: number) => {
        while (got.length < n || held.length > 0) {
          const d = held.shift();
          if (d) r.ack(d);
          else await waitFor(() => held.length > 0, "a delivery");
        }
      };
      await ackUntil(10);
      for (let i = 10; i < 15; i++) await m.publish("c.r", "t", i);
      await ackUntil(15);
      expect(got).toEqual(Array.from({ length: 15 }, (_, i) => i + 1));
      expect(most).toBeLessThanOrEqual(4);
      let settled = false;
      void ended.then(() => (settled = true));
      r.stop();
      await waitFor(() => settled, "run to settle after stop");
      await m.close();
    });
  }

  test("run waits while the consumer is busy, and looks again once it is not", async () => {
    const m = await open();
    const sub = m.openSubscriber("c.b", "s", { from: "earliest" });
    const r = new CursorReader(sub, { form: MESSAGES, window: new Window(100), unit: "record", maxRecords: 1 });
    const got: number[] = [];
    let release: (() => void) | null = null;
    const busy = () => new Promise<void>((res) => (release = res));
    void r.run((ds) => {
      for (const d of ds) {
        got.push(d.records[0]!.seq);
        r.ack(d);
      }
    }, busy);
    await m.publish("c.b", "t", 1);
    await m.publish("c.b", "t", 2);
    await waitFor(() => got.length === 1, "the first record");
    // Held back by the consumer: the second waits until it is ready.
    await m.publish("c.b", "t", 3);
    expect(got).toEqual([1]);
    release!();
    await waitFor(() => got.length === 2, "the second after the consumer is ready");
    release!();
    await waitFor(() => got.length === 3, "the third");
    expect(got).toEqual([1, 2, 3]);
    r.stop();
    await m.close();
  });

  test("run rejects with what the consumer threw, and stops", async () => {
    const m = await open();
    const sub = m.openSubscriber("c.e", "s", { from: "earliest" });
    const r = new CursorReader(sub, { form: MESSAGES, window: new Window(10), unit: "record", maxRecords: 10 });
    const ended = r.run(
      () => {
        throw new Error("consumer broke");
      },
      () => undefined,
    );
    await m.publish("c.e", "t", 1);
    await expect(ended).rejects.toThrow("consumer broke");
    // Nothing was acknowledged: the record is still after the cursor.
    expect(sub.cursorOf("c.e")).toBe(1);
    await m.close();
  });
});
