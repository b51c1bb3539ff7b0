/**
 * The receiver's ACKs: prompt unless the sender said it has window to
 * spare and the batch came within the hold of the one before, then held
 * briefly and sent together, always in batch order.
 */
import { describe, expect, test } from "bun:test";
import { buildEnvelope } from "../../src/envelope/build.ts";
import { MessageIds } from "../../src/envelope/message-id.ts";
import { RecentIds } from "../../src/federation/dedup.ts";
import { FrameDecoder } from "../../src/federation/frame.ts";
import type { Link } from "../../src/federation/link.ts";
import { parseAck, type Batch } from "../../src/federation/messages.ts";
import { Receiver } from "../../src/federation/receiver.ts";
import type { SinkRecord } from "../../src/federation/sink.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { waitFor } from "../helpers.ts";

const ids = new MessageIds();

/** A session that records the batch numbers of the ACKs sent on it, and when. */
function fakeLink() {
  const acks: { batch: number; at: number }[] = [];
  const decoder = new FrameDecoder(1 << 20);
  const link: Link & { state: "open" | "closed" } = {
    peer: { name: "dev" },
    state: "open",
    send(frame) {
      for (const f of decoder.push(frame)) acks.push({ batch: parseAck(f).batch, at: performance.now() });
      return true;
    },
    writable: () => Promise.resolve(),
    pack: (f) => f,
    close() {
      link.state = "closed";
    },
  };
  return { link, acks };
}

function setup(ackHoldMs: number) {
  const stored: { channel: string; records: readonly SinkRecord[]; at: number }[] = [];
  const receiver = new Receiver({
    sink: { store: async (channel, records) => void stored.push({ channel, records, at: performance.now() }) },
    self: "hub",
    dedup: new RecentIds(1000),
    logger: silentLogger,
    ackHoldMs,
  });
  return { receiver, stored, ...fakeLink() };
}

let seq = 0;
const batch = (n: number, delayAck: boolean): Batch => {
  seq++;
  const b: Batch = { batch: n, channel: "up.x", seqs: [seq], records: [buildEnvelope("dev", { channel: "up.x", type: "t", payload: n }, 65_536, ids).body] };
  if (delayAck) b.delayAck = true;
  return b;
};

/** Lets the receiver's promise chain run (a few turns of the event loop). */
async function turns(n = 5): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise<void>((r) => setImmediate(r));
}

describe("Receiver ACKs", () => {
  test("a batch without the sender's leave to wait is acknowledged as soon as it is stored", async () => {
    const { receiver, stored, link, acks } = setup(60_000);
    receiver.handle(link, batch(1, false));
    await waitFor(() => acks.length === 1, "the ack");
    expect(stored).toHaveLength(1);
    expect(acks.map((a) => a.batch)).toEqual([1]);
  });

  test("ACKs the sender let wait are held, then go out with the next prompt one, in order", async () => {
    const { receiver, stored, link, acks } = setup(60_000);
    for (const n of [1, 2, 3]) receiver.handle(link, batch(n, true));
    await waitFor(() => stored.length === 3, "three stored");
    await turns();
    // The first came alone (nothing before it), so nothing would have joined its ACK.
    expect(acks.map((a) => a.batch)).toEqual([1]);
    receiver.handle(link, batch(4, false));
    await waitFor(() => acks.length === 4, "four acks");
    expect(acks.map((a) => a.batch)).toEqual([1, 2, 3, 4]);
  });

  test("held ACKs go out after the hold, not before, together", async () => {
    const { receiver, stored, link, acks } = setup(200);
    for (const n of [1, 2, 3]) receiver.handle(link, batch(n, true));
    await waitFor(() => acks.length === 3, "three acks");
    expect(acks.map((a) => a.batch)).toEqual([1, 2, 3]);
    expect(acks[1]!.at - stored[1]!.at).toBeGreaterThanOrEqual(180);
    // One hold for both, not one each.
    expect(acks[2]!.at - acks[1]!.at).toBeLessThan(100);
  });

  test("a batch that comes longer than the hold after the one before is acknowledged in its turn, without the timer", async () => {
    const { receiver, stored, link, acks } = setup(200);
    receiver.handle(link, batch(1, true));
    await waitFor(() => acks.length === 1, "the first ack");
    expect(acks[0]!.at - stored[0]!.at).toBeLessThan(100);
    // A board's pace: the next one comes after the hold has passed.
    await waitFor(() => performance.now() - stored[0]!.at > 250, "past the hold", 2_000);
    receiver.handle(link, batch(2, true));
    await waitFor(() => acks.length === 2, "the second ack");
    expect(acks[1]!.at - stored[1]!.at).toBeLessThan(100);
    // One right behind it is held again.
    receiver.handle(link, batch(3, true));
    await waitFor(() => stored.length === 3, "the third stored");
    await turns();
    expect(acks).toHaveLength(2);
    await waitFor(() => acks.length === 3, "the held ack");
    expect(acks[2]!.at - stored[2]!.at).toBeGreaterThanOrEqual(180);
    expect(acks.map((a) => a.batch)).toEqual([1, 2, 3]);
  });

  test("flushAcks sends what is held at once; stop drops it, and nothing is sent on a closed session", async () => {
    // Each time the first batch is acknowledged at once (it came alone); the second is held.
    const a = setup(60_000);
    a.receiver.handle(a.link, batch(1, true));
    a.receiver.handle(a.link, batch(2, true));
    await waitFor(() => a.stored.length === 2, "stored");
    await turns();
    expect(a.acks.map((x) => x.batch)).toEqual([1]);
    a.receiver.flushAcks();
    expect(a.acks.map((x) => x.batch)).toEqual([1, 2]);

    const b = setup(30);
    b.receiver.handle(b.link, batch(1, true));
    b.receiver.handle(b.link, batch(2, true));
    await waitFor(() => b.stored.length === 2, "stored");
    await turns();
    b.receiver.stop();
    const c = setup(30);
    c.receiver.handle(c.link, batch(1, true));
    c.receiver.handle(c.link, batch(2, true));
    await waitFor(() => c.stored.length === 2, "stored");
    await turns();
    c.link.close("shutdown", "test");
    // Both would have sent by now had they been held still.
    await waitFor(() => performance.now() - c.stored[1]!.at > 100, "past the hold", 2_000);
    expect(b.acks.map((x) => x.batch)).toEqual([1]);
    expect(c.acks.map((x) => x.batch)).toEqual([1]);
  });

  test("a store done before storeNow returns is acknowledged at once, but never ahead of an earlier batch still being stored", async () => {
    const stored: string[] = [];
    const later: (() => void)[] = [];
    const failures: unknown[] = [];
    let mode: "now" | "later" | "reject" | "throw" = "now";
    const receiver = new Receiver({
      sink: {
        store: () => Promise.reject(new Error("storeNow is there: store must not be called")),
        storeNow: (_channel, records) => {
          const ids = records.map((r) => r.id);
          if (mode === "throw") throw new Error("disk on fire");
          if (mode === "reject") return Promise.reject(new Error("disk full"));
          if (mode === "now") {
            stored.push(...ids);
            return undefined;
          }
          return new Promise<void>((resolve) => later.push(() => (stored.push(...ids), resolve())));
        },
      },
      self: "hub",
      dedup: new RecentIds(1000),
      logger: { ...silentLogger, error: (_m: string, f?: Record<string, unknown>) => void failures.push(f?.error) },
    });
    const { link, acks } = fakeLink();
    const one = (n: number, body = buildEnvelope("dev", { channel: "up.x", type: "t", payload: n }, 65_536, ids).body): Batch => ({ batch: n, channel: "up.x", seqs: [n], records: [body] });

    receiver.handle(link, one(1));
    expect(acks.map((a) => a.batch)).toEqual([1]); // stored and acknowledged before handle returned

    mode = "later";
    const slow = one(2);
    receiver.handle(link, slow);
    mode = "now";
    receiver.handle(link, one(3));
    // The same record as batch 2, while batch 2 is still being stored: a duplicate, not stored twice.
    receiver.handle(link, one(4, slow.records[0]));
    await turns();
    expect(stored).toHaveLength(2); // batches 1 and 3
    expect(acks.map((a) => a.batch)).toEqual([1]); // 3 and 4 wait behind 2
    later.shift()!();
    await waitFor(() => acks.length === 4, "the ACKs of 2, 3 and 4");
    expect(acks.map((a) => a.batch)).toEqual([1, 2, 3, 4]);
    expect(stored).toHaveLength(3);
    expect(receiver.stats).toMatchObject({ stored: 3, duplicates: 1 });

    // With the chain empty again, a store done at once is acknowledged at once.
    receiver.handle(link, one(5));
    expect(acks.map((a) => a.batch)).toEqual([1, 2, 3, 4, 5]);

    // A store that fails, at once or later, is not acknowledged: the session closes.
    for (const m of ["throw", "reject"] as const) {
      const f = fakeLink();
      mode = m;
      receiver.handle(f.link, one(6));
      await waitFor(() => f.link.state === "closed", `closed after ${m}`);
      expect(f.acks).toEqual([]);
    }
    expect(failures.map(String)).toEqual(["Error: disk on fire", "Error: disk full"]);
    expect(receiver.stats.stored).toBe(4);
  });

  test("a record twice in one batch, and again in a later one of one record, is stored once; both batches are acknowledged", async () => {
    const a = setup(0);
    const env = buildEnvelope("dev", { channel: "up.x", type: "t", payload: "once" }, 65_536, ids).body;
    const other = buildEnvelope("dev", { channel: "up.x", type: "t", payload: "other" }, 65_536, ids).body;
    a.receiver.handle(a.link, { batch: 1, channel: "up.x", seqs: [1, 2, 3], records: [env, other, env] });
    await waitFor(() => a.acks.length === 1, "the first ACK");
    a.receiver.handle(a.link, { batch: 2, channel: "up.x", seqs: [4], records: [env] });
    await waitFor(() => a.acks.length === 2, "the second ACK");
    expect(a.stored.map((s) => s.records.length)).toEqual([2]);
    expect(a.receiver.stats.duplicates).toBe(2);
  });
});
