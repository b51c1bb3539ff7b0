import { describe, expect, test } from "bun:test";
import { CursorReader, MESSAGES } from "../../src/messenger/cursor-reader.ts";
import { Messenger } from "../../src/messenger/messenger.ts";
import { Window } from "../../src/messenger/window.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { tmpDir } from "../helpers.ts";

const open = () => Messenger.open({ storage: { dataDir: tmpDir() }, logger: silentLogger });
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
});
