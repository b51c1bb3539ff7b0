/**
 * Channel policies in the messenger: time to live (per publish and per
 * channel), and the bounded buffer's full policies `reject` and
 * `drop_oldest` (`latest` is a link's: test/integration/links.test.ts).
 */
import { describe, expect, test } from "bun:test";
import { BufferFullError, Messenger, type Message, type MessengerConfig } from "../../src/index.ts";
import { ChannelPolicies } from "../../src/messenger/channel-policy.ts";
import { tmpDir, waitFor } from "../helpers.ts";

const open = (extra: Partial<MessengerConfig> = {}) => Messenger.open({ name: "dev1", ...extra, storage: { dataDir: tmpDir(), ...extra.storage } });
const stats = (m: Messenger, channel: string) => m.stats().channels.find((c) => c.channel === channel)!;
const reading = "x".repeat(1000);

describe("ChannelPolicies", () => {
  test("the first matching entry applies; a bounded channel gets segments of an eighth of its bound", () => {
    const p = new ChannelPolicies([
      { pattern: "t.fast", ttlMs: 1000 },
      { pattern: "t.>", ttlMs: 60_000, maxBytes: 1 << 20, fullPolicy: "reject" },
    ]);
    expect(p.of("t.fast")).toEqual({ ttlMs: 1000, maxBytes: undefined, fullPolicy: "drop_oldest" });
    expect(p.of("t.slow").fullPolicy).toBe("reject");
    expect(p.of("other").ttlMs).toBeUndefined();
    expect(p.segmentBytes("t.slow", 64 << 20)).toBe(128 * 1024);
    expect(p.segmentBytes("other", 64 << 20)).toBe(64 << 20);
    expect(new ChannelPolicies([{ pattern: ">", maxBytes: 8192 }]).segmentBytes("a", 64 << 20)).toBe(4096);
  });
});

describe("time to live", () => {
  test("an expired message is not delivered to a handler or a pull, is counted once, and does not stay as lag", async () => {
    const m = await open();
    const r1 = await m.publish("t.x", "n", 1, { ttlMs: 30 });
    await m.publish("t.x", "n", 2, { ttlMs: 30 });
    const r3 = await m.publish("t.x", "n", 3);
    const exp = (await m.openSubscriber("t.x", "probe", { from: "earliest" }).fetch({ max: 10 })).map((x) => x.payload);
    expect(exp).toEqual([1, 2, 3]); // not yet expired
    await waitFor(() => Date.now() > r1.ts + 40, "the ttl passed", 2000, 5);
    const got: Message[] = [];
    await m.subscribe("t.x", "h", (msg) => void got.push(msg), { from: "earliest" });
    await waitFor(() => got.length === 1, "the live one delivered");
    expect(got[0]!.id).toBe(r3.id);
    const pull = m.openSubscriber("t.x", "puller", { from: "earliest" });
    expect((await pull.fetch({ max: 10 })).map((x) => x.seq)).toEqual([3]);
    // The expired prefix was acknowledged for the puller: it is no lag of its.
    expect(pull.lag()).toBe(1);
    expect((await pull.fetch({ max: 10 })).map((x) => x.seq)).toEqual([3]);
    // handler 2 + puller 2 + (the probe saw them live)
    await waitFor(() => stats(m, "t.x").expired === 4, "expired counted once per subscriber");
    await m.close();
  });

  test("a channel's default ttl applies unless the publish names one", async () => {
    const m = await open({ channels: [{ pattern: "t.>", ttlMs: 60_000 }] });
    const before = Date.now();
    await m.publish("t.x", "n", 1);
    await m.publish("t.x", "n", 2, { ttlMs: 5 });
    await m.publish("u.x", "n", 3);
    const [a, b] = await m.openSubscriber("t.x", "p", { from: "earliest" }).fetch({ max: 10 });
    expect(a!.expires).toBeGreaterThanOrEqual(before + 60_000);
    expect(b === undefined || b.expires! <= Date.now() + 5).toBe(true);
    const [c] = await m.openSubscriber("u.x", "p", { from: "earliest" }).fetch({ max: 10 });
    expect(c!.expires).toBeUndefined();
    await expect(m.publish("t.x", "n", 1, { ttlMs: -1 })).rejects.toThrow(/ttl/);
    await m.close();
  });
});

describe("bounded buffers", () => {
  test("reject: a full channel refuses publishes (buffer_full) until its subscribers acknowledge; nothing stored is lost", async () => {
    const m = await open({ channels: [{ pattern: "buf.>", maxBytes: 32 * 1024, fullPolicy: "reject" }] });
    const sub = m.openSubscriber("buf.x", "link", { from: "earliest" });
    let stored = 0;
    let refused: unknown;
    for (let i = 0; i < 100 && !refused; i++) {
      try {
        await m.publish("buf.x", "n", { i, reading });
        stored++;
      } catch (err) {
        refused = err;
      }
    }
    expect(refused).toBeInstanceOf(BufferFullError);
    expect((refused as BufferFullError).code).toBe("buffer_full");
    expect(stored).toBeGreaterThan(20);
    expect(stored).toBeLessThan(33);
    expect(stats(m, "buf.x").rejected).toBe(1);
    // A batch that does not fit is refused whole.
    await expect(m.publishBatch([{ channel: "buf.x", type: "n", payload: reading }])).rejects.toThrow(BufferFullError);
    // Everything stored is still there for the subscriber.
    const got = await sub.fetch({ max: 1000 });
    expect(got.map((x) => (x.payload as { i: number }).i)).toEqual([...Array(stored).keys()]);
    sub.ack("buf.x", got.at(-1)!.seq);
    await m.publish("buf.x", "n", { i: stored, reading });
    expect(stats(m, "buf.x").bytes).toBeLessThanOrEqual(32 * 1024);
    await m.close();
  });

  test("drop_oldest: the channel is cut back to its bound, unread or not", async () => {
    const m = await open({ channels: [{ pattern: "drop.>", maxBytes: 32 * 1024 }] });
    const sub = m.openSubscriber("drop.x", "slow", { from: "earliest" });
    for (let i = 0; i < 100; i++) await m.publish("drop.x", "n", { i, reading });
    await waitFor(() => stats(m, "drop.x").bytes <= 32 * 1024, "cut back to 32 KiB");
    const got = await sub.fetch({ max: 1000 });
    expect(got.length).toBeLessThan(40);
    expect((got.at(-1)!.payload as { i: number }).i).toBe(99);
    await m.close();
  });
});
