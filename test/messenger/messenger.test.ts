import { describe, expect, test } from "bun:test";
import { Messenger, RetryLater, type Message, type MessengerConfig } from "../../src/index.ts";
import { encodeEnvelope } from "../../src/envelope/envelope.ts";
import { tmpDir, waitFor } from "../helpers.ts";

const open = (dir = tmpDir(), extra: Partial<MessengerConfig> = {}) => Messenger.open({ name: "dev1", ...extra, storage: { ...extra.storage, dataDir: dir } });

describe("publish", () => {
  test("returns id and seq after the write; the envelope is stamped as SPEC §2", async () => {
    const m = await open();
    const got: Message[] = [];
    await m.subscribe("alerts", "n", (msg) => void got.push(msg));
    const r = await m.publish("alerts", "com.example.Alert", { text: "hot" }, { correlationId: "c1", serviceName: "mon" });
    expect(r.seq).toBe(1);
    expect(r.id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    await waitFor(() => got.length === 1, "delivery");
    expect(got[0]).toMatchObject({
      v: 1,
      id: r.id,
      seq: 1,
      ts: r.ts,
      channel: "alerts",
      origin: "dev1",
      type: "com.example.Alert",
      correlationId: "c1",
      serviceName: "mon",
      route: ["dev1"],
      payload: { text: "hot" },
    });
    await m.close();
  });

  test("bad input gets typed errors and stores nothing", async () => {
    const m = await open(tmpDir(), { maxMessageBytes: 1000 });
    const cases: [() => Promise<unknown>, string][] = [
      [() => m.publish("bad..name", "t", 1), "invalid_channel"],
      [() => m.publish("../etc", "t", 1), "invalid_channel"],
      [() => m.publish("a.dead-letter", "t", 1), "reserved_channel"],
      [() => m.publish("a", "", 1), "invalid_argument"],
      [() => m.publish("a", "t", "x".repeat(2000)), "too_large"],
      [() => m.publish("a", "t", { s: Symbol("x") }), "invalid_argument"],
      [() => m.publish("a", "t", 1, { correlationId: "" }), "invalid_argument"],
      // What a hub would refuse to store is refused here (it would otherwise block the link).
      [() => m.publish("a", "t", JSON.parse("[".repeat(65) + "]".repeat(65))), "invalid_argument"],
    ];
    for (const [fn, code] of cases) await expect(fn()).rejects.toMatchObject({ code });
    expect(m.stats().totals.messages).toBe(0);
    // Up to 64 levels, and dates (the msgpack timestamp), are fine.
    expect((await m.publish("a", "t", JSON.parse("[".repeat(63) + "]".repeat(63)))).seq).toBe(1);
    expect((await m.publish("a", "t", { at: new Date(0) })).seq).toBe(2);
    await m.close();
  });

  test("publishBatch validates everything first, then stores each channel in one commit", async () => {
    const m = await open();
    await expect(
      m.publishBatch([
        { channel: "a", type: "t", payload: 1 },
        { channel: "bad..x", type: "t", payload: 2 },
      ]),
    ).rejects.toMatchObject({ code: "invalid_channel" });
    expect(m.stats().totals.messages).toBe(0);
    const rs = await m.publishBatch([
      { channel: "a", type: "t", payload: 1 },
      { channel: "b", type: "t", payload: 2 },
      { channel: "a", type: "t", payload: 3 },
    ]);
    expect(rs.map((r) => [r.channel, r.seq])).toEqual([
      ["a", 1],
      ["b", 1],
      ["a", 2],
    ]);
    expect(m.stats().latency.fsync.count).toBeLessThanOrEqual(2 + 2); // one per channel, plus channel creation slack
    // Interleaved channels, both open: each result is its own entry's, seqs consecutive per channel, one commit each.
    const before = m.stats().latency.fsync.count;
    const mixed = Array.from({ length: 9 }, (_, i) => ({ channel: i % 3 === 0 ? "b" : "a", type: "t", payload: 10 + i }));
    const rm = await m.publishBatch(mixed);
    expect(rm.map((r) => [r.channel, r.seq])).toEqual(mixed.map((e, i) => [e.channel, e.channel === "b" ? 2 + i / 3 : 3 + i - Math.ceil(i / 3)]));
    expect(m.stats().latency.fsync.count - before).toBe(2);
    const got: Message[] = [];
    await m.subscribe("a", "r", (msg) => void got.push(msg), { from: "earliest" });
    await waitFor(() => got.length === 8, "channel a");
    expect(got.map((g) => [g.seq, g.payload])).toEqual([[1, 1], [2, 3], ...mixed.flatMap((e, i) => (e.channel === "a" ? [[3 + i - Math.ceil(i / 3), e.payload]] : []))]);
    expect(rm.filter((r) => r.channel === "a").map((r) => r.seq)).toEqual([3, 4, 5, 6, 7, 8]);
    await m.close();
  });

  test("ingestNow: a lone forwarded record into an open log with nothing ahead is stored before it returns; otherwise a promise, and bad input rejects rather than throws", async () => {
    const m = await open(tmpDir(), { maxMessageBytes: 1000, storage: { dataDir: "", sync: "none" } });
    try {
      const env = (n: number) => encodeEnvelope({ id: `id-${n}`, ts: Date.now(), channel: "up.x", origin: "dev", type: "t", route: ["dev", "dev1"], payload: n });
      // The channel's log is not open yet: the long way, as `ingest`.
      const first = m.ingestNow("up.x", env(1));
      expect(first).toBeInstanceOf(Promise);
      expect(await first).toBe(1);
      // Once nothing waits in the log (its first fill, the turn a group commit leaves), a record
      // is stored before the call returns: its seq, and the log has moved, with no await between.
      let n = 1;
      let atOnce = 0;
      const deadline = performance.now() + 5_000;
      while (atOnce < 3 && performance.now() < deadline) {
        n++;
        const r = m.ingestNow("up.x", env(n));
        if (typeof r === "number") {
          expect(r).toBe(n);
          expect(m.channelLog("up.x")?.nextSeq).toBe(n + 1);
          atOnce++;
        } else expect(await r).toBe(n);
        await new Promise((r) => setImmediate(r));
      }
      expect(atOnce).toBe(3);
      // A lone record right behind several still being stored keeps its place behind them.
      const behind = m.ingest("up.x", [env(n + 1), env(n + 2)]);
      const lone = m.ingestNow("up.x", env(n + 3));
      expect(lone).toBeInstanceOf(Promise);
      expect(await behind).toEqual([n + 1, n + 2]);
      expect(await lone).toBe(n + 3);
      n += 3;
      // Bad input is refused as `ingest` refuses it, as a rejection.
      const big = m.ingestNow("up.x", new Uint8Array(2000));
      await expect(Promise.resolve(big)).rejects.toMatchObject({ code: "too_large" });
      const bad = m.ingestNow("bad..x", env(0));
      await expect(Promise.resolve(bad)).rejects.toMatchObject({ code: "invalid_channel" });
      expect(m.stats().channels.find((c) => c.channel === "up.x")?.published).toBe(n);
      const got: number[] = [];
      await m.subscribe("up.x", "r", (msg) => void got.push(msg.payload as number), { from: "earliest" });
      await waitFor(() => got.length === n, "all delivered");
      expect(got).toEqual(Array.from({ length: n }, (_, i) => i + 1));
    } finally {
      await m.close();
    }
    const closed = m.ingestNow("up.x", new Uint8Array(10));
    expect(closed).toBeInstanceOf(Promise);
    await expect(closed).rejects.toMatchObject({ code: "closed" });
  });

  test("publishTo: told by a call once stored, in publish order, counted as published; a bad message for an open log refused before it returns; channels with policies and ones not open yet take publish's way", async () => {
    const m = await open(tmpDir(), { maxMessageBytes: 1000 });
    const outcomes: string[] = [];
    const waiter = (name: string) => ({ publishSettled: (err: unknown) => void outcomes.push(err === undefined ? name : `${name}:${(err as { code: string }).code}`) });
    try {
      // Not open yet: the long way, with the same outcome.
      m.publishTo("win", "t", 0, undefined, waiter("first"));
      await waitFor(() => outcomes.length === 1, "the first, through publish");
      expect(outcomes).toEqual(["first"]);
      // Open: a window of them in one turn, each told by a call after the turn's commit.
      for (let i = 1; i <= 20; i++) m.publishTo("win", "t", i, { meta: { publisher: "c1" } }, waiter(`w${i}`));
      expect(outcomes.length).toBe(1);
      await waitFor(() => outcomes.length === 21, "the window");
      expect(outcomes.slice(1)).toEqual(Array.from({ length: 20 }, (_, i) => `w${i + 1}`));
      expect(m.stats().channels.find((c) => c.channel === "win")?.published).toBe(21);
      // Refused before the call returns.
      m.publishTo("win", "", 1, undefined, waiter("no-type"));
      expect(outcomes.at(-1)).toBe("no-type:invalid_argument");
      m.publishTo("win", "t", "x".repeat(2000), undefined, waiter("big"));
      expect(outcomes.at(-1)).toBe("big:too_large");
      // A channel with no open log (here one that cannot be) is checked the long way.
      m.publishTo("bad..x", "t", 1, undefined, waiter("bad"));
      await waitFor(() => outcomes.at(-1) === "bad:invalid_channel", "the bad channel refused");
      const got: Message[] = [];
      await m.subscribe("win", "r", (msg) => void got.push(msg), { from: "earliest" });
      await waitFor(() => got.length === 21, "all delivered");
      expect(got.map((g) => g.payload)).toEqual(Array.from({ length: 21 }, (_, i) => i));
      expect(got[5]!.publisher).toBe("c1");
    } finally {
      await m.close();
    }
    const after: unknown[] = [];
    m.publishTo("win", "t", 1, undefined, { publishSettled: (err) => void after.push(err) });
    await waitFor(() => after.length === 1, "refused after close");
    expect(after[0]).toMatchObject({ code: "closed" });
    // With channel policies: publish's way (room made first), told all the same, refusals too.
    const p = await open(tmpDir(), { channels: [{ pattern: "capped.>", maxBytes: 32 * 1024, fullPolicy: "reject" }] });
    try {
      for (let i = 0; i < 3; i++) p.publishTo("capped.a", "t", i, undefined, waiter(`capped${i}`));
      p.publishTo("capped.a", "", 1, undefined, waiter("capped-bad"));
      await waitFor(() => outcomes.length === 4 + 21 + 3, "the capped channel's");
      expect(outcomes.slice(-4).sort()).toEqual(["capped-bad:invalid_argument", "capped0", "capped1", "capped2"]);
      expect(p.stats().channels.find((c) => c.channel === "capped.a")?.published).toBe(3);
    } finally {
      await p.close();
    }
  });

  test("publishing after close is refused", async () => {
    const m = await open();
    await m.close();
    await expect(m.publish("a", "t", 1)).rejects.toMatchObject({ code: "closed" });
  });
});

describe("subscribe", () => {
  test("a new subscriber starts at latest by default; earliest and a seq are honoured", async () => {
    const m = await open();
    for (let i = 1; i <= 5; i++) await m.publish("c", "t", i);
    const latest: number[] = [];
    const earliest: number[] = [];
    const fromSeq: number[] = [];
    await m.subscribe("c", "latest", (msg) => void latest.push(msg.payload as number));
    await m.subscribe("c", "earliest", (msg) => void earliest.push(msg.payload as number), { from: "earliest" });
    await m.subscribe("c", "from3", (msg) => void fromSeq.push(msg.payload as number), { from: 3 });
    await m.publish("c", "t", 6);
    await waitFor(() => latest.length === 1 && earliest.length === 6 && fromSeq.length === 4, "deliveries");
    expect(latest).toEqual([6]);
    expect(earliest).toEqual([1, 2, 3, 4, 5, 6]);
    expect(fromSeq).toEqual([3, 4, 5, 6]);
    await m.close();
  });

  test("delivery is in order per channel and resumes after a reopen where it acked", async () => {
    const dir = tmpDir();
    let m = await open(dir);
    const seen: number[] = [];
    await m.subscribe("c", "s", (msg) => void seen.push(msg.payload as number), { from: "earliest" });
    await Promise.all(Array.from({ length: 200 }, (_, i) => m.publish("c", "t", i)));
    await waitFor(() => seen.length === 200, "first 200");
    expect(seen).toEqual(Array.from({ length: 200 }, (_, i) => i));
    await m.close();
    m = await open(dir);
    for (let i = 200; i < 210; i++) await m.publish("c", "t", i);
    const after: number[] = [];
    await m.subscribe("c", "s", (msg) => void after.push(msg.payload as number));
    await waitFor(() => after.length === 10, "resumed");
    expect(after).toEqual(Array.from({ length: 10 }, (_, i) => 200 + i));
    await m.close();
  });

  test("a pattern covers existing channels and channels created later, skipping dead letters", async () => {
    const m = await open();
    await m.publish("sensors.a.temp", "t", "old");
    const got: string[] = [];
    await m.subscribe("sensors.*.temp", "p", (msg) => void got.push(`${msg.channel}:${msg.payload}`));
    await m.publish("sensors.a.temp", "t", "a1");
    await m.publish("sensors.b.temp", "t", "b1"); // created after subscribe: delivered from its start
    await m.publish("sensors.b.hum", "t", "nope");
    await m.publish("sensors.b.temp", "t", "b2");
    await waitFor(() => got.length === 3, "pattern deliveries");
    expect(got.sort()).toEqual(["sensors.a.temp:a1", "sensors.b.temp:b1", "sensors.b.temp:b2"]);
    await m.close();
  });

  test("a running subscriber name cannot be subscribed twice; bad names and patterns are typed errors", async () => {
    const m = await open();
    await m.subscribe("c", "s", () => {});
    await expect(m.subscribe("c", "s", () => {})).rejects.toMatchObject({ code: "invalid_argument" });
    await expect(m.subscribe("a.>.b", "s", () => {})).rejects.toMatchObject({ code: "invalid_pattern" });
    await expect(m.subscribe("c", "../x", () => {})).rejects.toMatchObject({ code: "invalid_name" });
    await expect(m.subscribe("c", "t", () => {}, { from: 0 })).rejects.toMatchObject({ code: "invalid_argument" });
    await m.close();
  });

  test("unsubscribe keeps the cursor; deleteCursor forgets it", async () => {
    const m = await open();
    const seen: number[] = [];
    let sub = await m.subscribe("c", "s", (msg) => void seen.push(msg.seq), { from: "earliest" });
    await m.publish("c", "t", 1);
    await waitFor(() => seen.length === 1, "first");
    await m.unsubscribe(sub);
    await m.publish("c", "t", 2);
    sub = await m.subscribe("c", "s", (msg) => void seen.push(msg.seq));
    await waitFor(() => seen.length === 2, "second after resubscribe");
    expect(seen).toEqual([1, 2]);
    await m.unsubscribe(sub, { deleteCursor: true });
    expect(m.stats().totals.subscribers).toBe(0);
    await m.close();
  });

  test("stats report cursor, lag and counters", async () => {
    const m = await open();
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let calls = 0;
    await m.subscribe("c", "slow", async () => {
      calls++;
      await gate;
    });
    for (let i = 0; i < 5; i++) await m.publish("c", "t", i);
    await waitFor(() => calls === 1, "first call");
    const st = m.stats();
    const ch = st.channels.find((c) => c.channel === "c")!;
    expect(ch).toMatchObject({ firstSeq: 1, nextSeq: 6, messages: 5, published: 5 });
    expect(ch.subscribers).toEqual([{ name: "slow", pattern: "c", cursor: 1, lag: 5, skipped: 0, active: true }]);
    expect(st.latency.publishToDisk.count).toBe(5);
    release();
    await waitFor(() => m.stats().channels[0]!.subscribers[0]!.lag === 0, "caught up");
    expect(m.stats().channels[0]!.delivered).toBe(5);
    expect(m.stats().latency.publishToHandler.count).toBe(5);
    await m.close();
  });

  test("close waits for a running handler and flushes its cursor", async () => {
    const dir = tmpDir();
    const m = await open(dir);
    let finished = false;
    await m.subscribe("c", "s", async () => {
      await Bun.sleep(50);
      finished = true;
    });
    await m.publish("c", "t", 1);
    await waitFor(() => m.stats().channels[0]!.subscribers[0] !== undefined, "subscriber");
    await Bun.sleep(1);
    await m.close();
    expect(finished).toBe(true);
    const re = await open(dir);
    expect(re.stats().channels[0]!.subscribers[0]!.cursor).toBe(2);
    await re.close();
  });

  test("retention by bytes removes unread messages and counts them as skipped", async () => {
    const m = await open(tmpDir(), { storage: { dataDir: "", segmentBytes: 4096, retention: { maxBytes: 8192 }, retentionCheckMs: 3_600_000 } });
    await m.publish("c", "t", "first");
    // A subscriber that never gets past seq 1 pins the log...
    let sub = await m.subscribe(
      "c",
      "behind",
      () => {
        throw new RetryLater(60_000);
      },
      { from: "earliest" },
    );
    for (let i = 0; i < 200; i++) await m.publish("c", "t", "x".repeat(100));
    await m.runRetention();
    const first = m.stats().channels[0]!.firstSeq;
    expect(first).toBeGreaterThan(1);
    expect(m.stats().channels[0]!.bytes).toBeLessThanOrEqual(8192);
    await m.unsubscribe(sub);
    // ...but bytes win: on its return it starts at the new first seq and the gap is recorded.
    const seqs: number[] = [];
    sub = await m.subscribe("c", "behind", (msg) => void seqs.push(msg.seq));
    await waitFor(() => seqs.at(-1) === 201, "catch up");
    expect(seqs[0]).toBe(first);
    expect(m.stats().channels[0]!.subscribers[0]!.skipped).toBe(first - 1);
    await m.close();
  });
});
