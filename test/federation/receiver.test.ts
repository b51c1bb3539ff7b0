/**
 * The receiver's ACKs: prompt unless the sender said it has window to
 * spare, then held briefly and sent together, always in batch order.
 */
import { describe, expect, test } from "bun:test";
import { buildEnvelope } from "../../src/envelope/build.ts";
import { RecentIds } from "../../src/federation/dedup.ts";
import { FrameDecoder } from "../../src/federation/frame.ts";
import type { Link } from "../../src/federation/link.ts";
import { parseAck, type Batch } from "../../src/federation/messages.ts";
import { Receiver } from "../../src/federation/receiver.ts";
import type { SinkRecord } from "../../src/federation/sink.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { waitFor } from "../helpers.ts";

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
  const b: Batch = { batch: n, channel: "up.x", seqs: [seq], records: [buildEnvelope("dev", { channel: "up.x", type: "t", payload: n }, 65_536).body] };
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
    expect(acks).toHaveLength(0);
    receiver.handle(link, batch(4, false));
    await waitFor(() => acks.length === 4, "four acks");
    expect(acks.map((a) => a.batch)).toEqual([1, 2, 3, 4]);
  });

  test("held ACKs go out after the hold, not before, together", async () => {
    const { receiver, stored, link, acks } = setup(40);
    receiver.handle(link, batch(1, true));
    receiver.handle(link, batch(2, true));
    await waitFor(() => acks.length === 2, "both acks");
    expect(acks.map((a) => a.batch)).toEqual([1, 2]);
    expect(acks[0]!.at - stored[0]!.at).toBeGreaterThanOrEqual(30);
    // One hold for both, not one each.
    expect(acks[1]!.at - acks[0]!.at).toBeLessThan(20);
  });

  test("flushAcks sends what is held at once; stop drops it, and nothing is sent on a closed session", async () => {
    const a = setup(60_000);
    a.receiver.handle(a.link, batch(1, true));
    await waitFor(() => a.stored.length === 1, "stored");
    await turns();
    a.receiver.flushAcks();
    expect(a.acks.map((x) => x.batch)).toEqual([1]);

    const b = setup(30);
    b.receiver.handle(b.link, batch(1, true));
    await waitFor(() => b.stored.length === 1, "stored");
    await turns();
    b.receiver.stop();
    const c = setup(30);
    c.receiver.handle(c.link, batch(1, true));
    await waitFor(() => c.stored.length === 1, "stored");
    await turns();
    c.link.close("shutdown", "test");
    // Both would have sent by now had they been held still.
    await waitFor(() => performance.now() - c.stored[0]!.at > 100, "past the hold", 2_000);
    expect(b.acks).toHaveLength(0);
    expect(c.acks).toHaveLength(0);
  });

  test("a record twice in one batch, and again in a later one of one record, is stored once; both batches are acknowledged", async () => {
    const a = setup(0);
    const env = buildEnvelope("dev", { channel: "up.x", type: "t", payload: "once" }, 65_536).body;
    const other = buildEnvelope("dev", { channel: "up.x", type: "t", payload: "other" }, 65_536).body;
    a.receiver.handle(a.link, { batch: 1, channel: "up.x", seqs: [1, 2, 3], records: [env, other, env] });
    await waitFor(() => a.acks.length === 1, "the first ACK");
    a.receiver.handle(a.link, { batch: 2, channel: "up.x", seqs: [4], records: [env] });
    await waitFor(() => a.acks.length === 2, "the second ACK");
    expect(a.stored.map((s) => s.records.length)).toEqual([2]);
    expect(a.receiver.stats.duplicates).toBe(2);
  });
});
