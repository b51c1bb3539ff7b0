/**
 * The cases every push consumer of a durable subscriber must pass, whatever
 * carries its deliveries (a federation BATCH, an MQTT PUBLISH, a line of an
 * HTTP stream): run against each adapter of the cursor reader by
 * consumers.test.ts, as Hono runs one suite against each router.
 */
import { describe, expect, test } from "bun:test";
import { waitFor } from "../helpers.ts";

/** Deliveries a consumer may have unacknowledged in every case. */
export const WINDOW = 3;

/** One delivery as the consumer's client saw it. */
export interface Seen {
  channel: string;
  seqs: number[];
}

/** A running consumer of one subscriber, seen from its client's side. */
export interface Consumer {
  /** Deliveries received, in arrival order (a redelivery appears again). */
  readonly received: Seen[];
  /** The client acknowledges `d`. */
  ack(d: Seen): void;
  /** The client goes away without acknowledging anything more. */
  stop(): Promise<void>;
}

/** How one adapter is driven. */
export interface ConsumerHarness {
  name: string;
  /** "each": a delivery is acknowledged by itself; "cumulative": an ack covers everything before it on its channel. */
  acks: "each" | "cumulative";
  /** A consumer of the subscriber `name` on `pattern`, starting from the earliest record, window WINDOW. */
  start(pattern: string, name: string): Promise<Consumer>;
  /** Publishes one record to `channel`; resolves with its seq. */
  publish(channel: string): Promise<number>;
  /** The persisted cursor of subscriber `name` on `pattern` for `channel` (next seq it needs). */
  cursor(pattern: string, name: string, channel: string): number | undefined;
  close(): Promise<void>;
}

const seqsOf = (c: Consumer, channel: string) => c.received.filter((d) => d.channel === channel).flatMap((d) => d.seqs);

/** Waits until nothing more arrives for `ms` (for what must not happen, a bounded look is all there is). */
async function quietFor(c: Consumer, ms: number): Promise<void> {
  let n = c.received.length;
  let since = performance.now();
  while (performance.now() - since < ms) {
    await Bun.sleep(10);
    if (c.received.length !== n) {
      n = c.received.length;
      since = performance.now();
    }
  }
}

/** Publishes to `channel` one record at a time, each received before the next goes: one delivery each. */
async function oneByOne(h: ConsumerHarness, c: Consumer, channel: string, n: number): Promise<Seen[]> {
  const out: Seen[] = [];
  for (let i = 0; i < n; i++) {
    const seq = await h.publish(channel);
    out.push((await waitFor(() => c.received.find((x) => x.channel === channel && x.seqs.includes(seq)), `delivery of ${channel} ${seq}`))!);
  }
  return out;
}

export function consumerCases(make: () => Promise<ConsumerHarness>): void {
  let n = 0;
  const fresh = () => `rd${++n}`;

  test("every record once, in order per channel, when each delivery is acknowledged", async () => {
    const h = await make();
    const p = fresh();
    const c = await h.start(`${p}.>`, "s");
    let acked = 0;
    const ackAll = () => {
      for (; acked < c.received.length; acked++) c.ack(c.received[acked]!);
    };
    for (let i = 0; i < 7; i++) await h.publish(`${p}.a`);
    for (let i = 0; i < 5; i++) await h.publish(`${p}.b`);
    await waitFor(() => (ackAll(), seqsOf(c, `${p}.a`).length >= 7 && seqsOf(c, `${p}.b`).length >= 5), "all delivered");
    await waitFor(() => h.cursor(`${p}.>`, "s", `${p}.a`) === 8 && h.cursor(`${p}.>`, "s", `${p}.b`) === 6, "cursors past everything");
    expect(seqsOf(c, `${p}.a`)).toEqual([1, 2, 3, 4, 5, 6, 7]);
    expect(seqsOf(c, `${p}.b`)).toEqual([1, 2, 3, 4, 5]);
    await c.stop();
    await h.close();
  });

  test(`never more than ${WINDOW} deliveries unacknowledged; an acknowledgement makes room for one more`, async () => {
    const h = await make();
    const p = fresh();
    const c = await h.start(`${p}.x`, "s");
    const first = await oneByOne(h, c, `${p}.x`, WINDOW);
    for (let i = 0; i < 4; i++) await h.publish(`${p}.x`);
    await quietFor(c, 300);
    expect(c.received).toEqual(first);
    c.ack(first[0]!);
    await waitFor(() => c.received.length > WINDOW, "a delivery after the ack");
    await quietFor(c, 300);
    // Under cumulative acks the one ack covers a single delivery here, as under per-delivery acks.
    expect(c.received.length).toBe(WINDOW + 1);
    expect(c.received[WINDOW]!.seqs[0]).toBe(WINDOW + 1);
    await c.stop();
    await h.close();
  });

  test("what was sent and not acknowledged comes again to the next consumer, and the cursor stays before it", async () => {
    const h = await make();
    const p = fresh();
    let c = await h.start(`${p}.r`, "s");
    const ds = await oneByOne(h, c, `${p}.r`, 3);
    c.ack(ds[0]!);
    await waitFor(() => h.cursor(`${p}.r`, "s", `${p}.r`) === 2, "cursor past the first");
    await c.stop();
    expect(h.cursor(`${p}.r`, "s", `${p}.r`)).toBe(2);
    c = await h.start(`${p}.r`, "s");
    await waitFor(() => seqsOf(c, `${p}.r`).length >= 2, "the unacknowledged again");
    await quietFor(c, 200);
    expect(seqsOf(c, `${p}.r`)).toEqual([2, 3]);
    await c.stop();
    await h.close();
  });

  test("an acknowledgement out of order moves the cursor over the acknowledged prefix only", async () => {
    const h = await make();
    const p = fresh();
    const c = await h.start(`${p}.o`, "s");
    const ds = await oneByOne(h, c, `${p}.o`, 3);
    if (h.acks === "cumulative") {
      // A cumulative ack of the last covers the ones before it.
      c.ack(ds[2]!);
      await waitFor(() => h.cursor(`${p}.o`, "s", `${p}.o`) === 4, "cursor past all three");
    } else {
      c.ack(ds[2]!);
      c.ack(ds[1]!);
      await quietFor(c, 100);
      expect(h.cursor(`${p}.o`, "s", `${p}.o`)).toBe(1);
      c.ack(ds[0]!);
      await waitFor(() => h.cursor(`${p}.o`, "s", `${p}.o`) === 4, "cursor past all three");
    }
    await c.stop();
    await h.close();
  });
}

/** Runs every case against `make`'s adapter. */
export function describeConsumer(name: string, make: () => Promise<ConsumerHarness>): void {
  describe(`push consumer: ${name}`, () => consumerCases(make));
}
