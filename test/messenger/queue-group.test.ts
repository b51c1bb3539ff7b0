/** Queue groups: competing consumers of one durable subscriber, with fake members and with in-process workers. */
import { describe, expect, test } from "bun:test";
import { decodeEnvelope } from "../../src/envelope/envelope.ts";
import { ConflictError } from "../../src/errors.ts";
import { Messenger } from "../../src/messenger/messenger.ts";
import type { QueueDelivery, QueueGroup, QueueMember } from "../../src/messenger/queue-group.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { tmpDir, waitFor } from "../helpers.ts";

const open = (dir = tmpDir()) => Messenger.open({ storage: { dataDir: dir }, logger: silentLogger });

/** A member that holds up to `cap` messages until the test acks them. */
class Fake implements QueueMember {
  held: QueueDelivery[] = [];
  got: number[] = [];
  allowed = true;
  private readonly listeners = new Set<() => void>();
  constructor(
    public cap = 2,
    public readonly ackWaitMs?: number,
  ) {}
  room(): number {
    return this.cap - this.held.length;
  }
  onRoom(fn: () => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }
  mayReceive(): boolean {
    return this.allowed;
  }
  take(d: QueueDelivery): boolean {
    this.held.push(d);
    this.got.push(d.seq);
    return true;
  }
  release(d: QueueDelivery): void {
    this.held = this.held.filter((x) => x !== d);
    for (const fn of this.listeners) fn();
  }
  /** Acks everything it holds. */
  ackAll(g: QueueGroup): void {
    for (const d of [...this.held]) g.ack(d);
  }
}

async function publishN(m: Messenger, channel: string, n: number): Promise<void> {
  for (let i = 0; i < n; i++) await m.publish(channel, "t", { i, device: `d${i % 3}` });
}

describe("QueueGroup", () => {
  test("each message goes to one member; the cursor moves only past what is acked, in whatever order", async () => {
    const m = await open();
    await publishN(m, "q.a", 6);
    const sub = m.openSubscriber("q.a", "w", { from: "earliest" });
    const a = new Fake(2);
    const b = new Fake(2);
    const g = m.queues.join(sub, a);
    m.queues.join(sub, b);
    await waitFor(() => a.got.length + b.got.length === 4, "two each");
    expect(a.got.length).toBe(2);
    expect(b.got.length).toBe(2);
    expect(new Set([...a.got, ...b.got]).size).toBe(4);
    // The holder of seq 1 does not ack; everything else is acked as it comes.
    const one = [a, b].find((f) => f.got.includes(1))!;
    const other = one === a ? b : a;
    const keep = one.held.find((d) => d.seq === 1)!;
    for (const d of [...one.held]) if (d !== keep) g.ack(d);
    other.ackAll(g);
    await waitFor(() => a.got.length + b.got.length === 6, "the rest");
    other.ackAll(g);
    for (const d of [...one.held]) if (d !== keep) g.ack(d);
    expect(sub.cursorOf("q.a")).toBe(1); // seq 1 is not acked: nothing moves
    g.ack(keep);
    expect(sub.cursorOf("q.a")).toBe(7);
    expect(g.stats()).toMatchObject({ members: 2, in_hand: 0, queued: 0, redelivered: 0 });
    m.queues.leave(g, a);
    m.queues.leave(g, b);
    expect(m.queues.get("q.a", "w")).toBeUndefined();
    await m.close();
  });

  test("a member that leaves hands what it held to another, first and in order", async () => {
    const m = await open();
    await publishN(m, "q.b", 5);
    const sub = m.openSubscriber("q.b", "w", { from: "earliest" });
    const a = new Fake(3);
    const g = m.queues.join(sub, a);
    await waitFor(() => a.got.length === 3, "a holds three");
    expect(a.got).toEqual([1, 2, 3]);
    const b = new Fake(10);
    m.queues.join(sub, b);
    await waitFor(() => b.got.length === 2, "b gets the other two");
    expect(b.got).toEqual([4, 5]);
    m.queues.leave(g, a);
    await waitFor(() => b.got.length === 5, "b gets what a held");
    expect(b.got).toEqual([4, 5, 1, 2, 3]);
    expect(g.stats().redelivered).toBe(3);
    b.ackAll(g);
    expect(sub.cursorOf("q.b")).toBe(6);
    m.queues.leave(g, b);
    await m.close();
  });

  test("a message held past the member's ack wait goes to another; a late ack from the first still counts", async () => {
    const m = await open();
    await publishN(m, "q.c", 1);
    const sub = m.openSubscriber("q.c", "w", { from: "earliest" });
    const slow = new Fake(1, 80);
    const g = m.queues.join(sub, slow);
    await waitFor(() => slow.got.length === 1, "slow has it");
    const other = new Fake(1, 60_000);
    m.queues.join(sub, other);
    // Nothing else to take: `other` gets seq 1 only once slow's ack wait has passed.
    await waitFor(() => other.got.length === 1, "taken back and handed on", 5000);
    expect(slow.held.length).toBe(0); // released
    expect(other.got).toEqual([1]);
    expect(g.ackSeq("q.c", 1)).toBe(true); // slow's late ack
    expect(other.held.length).toBe(0);
    expect(sub.cursorOf("q.c")).toBe(2);
    expect(g.ackSeq("q.c", 1)).toBe(false); // acked already
    m.queues.leave(g, slow);
    m.queues.leave(g, other);
    await m.close();
  });

  test("with a key, messages with the same value go to the same member while it lives", async () => {
    const m = await open();
    await publishN(m, "q.k", 30);
    const sub = m.openSubscriber("q.k", "w", { from: "earliest" });
    const members = [new Fake(4), new Fake(4), new Fake(4)];
    const g = m.queues.join(sub, members[0]!, { key: "device" });
    for (const f of members.slice(1)) m.queues.join(sub, f, { key: "device" });
    expect(() => m.queues.join(sub, new Fake(), {})).toThrow(/keyed by "device"/);
    const devices = new Map<string, Set<Fake>>();
    const order = new Map<string, number[]>();
    const seen = () => members.reduce((n, f) => n + f.got.length, 0);
    while (seen() < 30) {
      await waitFor(() => members.some((f) => f.held.length > 0), "something held");
      for (const f of members)
        for (const d of [...f.held]) {
          const p = decodeEnvelope(d.record.body, d.seq).payload as { device: string };
          const set = devices.get(p.device) ?? new Set();
          set.add(f);
          devices.set(p.device, set);
          order.set(p.device, [...(order.get(p.device) ?? []), d.seq]);
          g.ack(d);
        }
    }
    expect(devices.size).toBe(3);
    for (const set of devices.values()) expect(set.size).toBe(1);
    for (const seqs of order.values()) expect(seqs).toEqual([...seqs].sort((x, y) => x - y));
    for (const f of members) m.queues.leave(g, f);
    await m.close();
  });

  test("a message no member may receive is passed over; a member that may waits for room", async () => {
    const m = await open();
    await publishN(m, "q.acl", 2);
    const sub = m.openSubscriber("q.acl", "w", { from: "earliest" });
    const f = new Fake(1);
    f.allowed = false;
    const g = m.queues.join(sub, f);
    await waitFor(() => sub.cursorOf("q.acl") === 3, "both passed over");
    expect(f.got).toEqual([]);
    m.queues.leave(g, f);
    await m.close();
  });

  test("the last member's leaving ends the group; the next member starts again at the cursor", async () => {
    const m = await open();
    await publishN(m, "q.r", 3);
    const sub = m.openSubscriber("q.r", "w", { from: "earliest" });
    const a = new Fake(3);
    let g = m.queues.join(sub, a);
    await waitFor(() => a.got.length === 3, "a has all");
    g.ack(a.held.find((d) => d.seq === 1)!);
    m.queues.leave(g, a);
    const b = new Fake(3);
    g = m.queues.join(sub, b);
    await waitFor(() => b.got.length === 2, "b gets the unacked");
    expect(b.got).toEqual([2, 3]);
    m.queues.leave(g, b);
    await m.close();
  });
});

describe("Messenger.subscribeQueue", () => {
  test("workers share a subscriber: every message handled once, in parallel, failures retried", async () => {
    const m = await open();
    let running = 0;
    let most = 0;
    const handled: number[] = [];
    let failedOnce = false;
    const q = await m.subscribeQueue(
      "jobs",
      "workers",
      async (msg) => {
        running++;
        most = Math.max(most, running);
        await Bun.sleep(5);
        running--;
        const i = (msg.payload as { i: number }).i;
        if (i === 7 && !failedOnce) {
          failedOnce = true;
          throw new Error("flaky");
        }
        handled.push(i);
      },
      { concurrency: 4, from: "earliest" },
    );
    expect(q.members).toBe(4);
    await publishN(m, "jobs", 40);
    await waitFor(() => handled.length === 40, "all handled");
    expect(new Set(handled).size).toBe(40);
    expect(most).toBeGreaterThan(1);
    await waitFor(() => m.openSubscriber("jobs", "workers").cursorOf("jobs") === 41, "cursor past all");
    await expect(m.subscribe("jobs", "workers", () => {})).rejects.toBeInstanceOf(ConflictError);
    await m.unsubscribe(q);
    expect(m.queues.get("jobs", "workers")).toBeUndefined();
    // A plain subscriber may have the name once the group is gone.
    const s = await m.subscribe("jobs", "workers", () => {});
    await expect(m.subscribeQueue("jobs", "workers", () => {})).rejects.toBeInstanceOf(ConflictError);
    await m.unsubscribe(s);
    await m.close();
  });

  test("two subscriptions on one name share it; stopping one hands its share to the other", async () => {
    const m = await open();
    const byA: number[] = [];
    const byB: number[] = [];
    let release: () => void = () => {};
    const gate = new Promise<void>((r) => (release = r));
    const a = await m.subscribeQueue(
      "jobs2",
      "w",
      async (msg) => {
        byA.push(msg.seq);
        await gate;
      },
      { from: "earliest" },
    );
    const b = await m.subscribeQueue("jobs2", "w", (msg) => void byB.push(msg.seq));
    await publishN(m, "jobs2", 10);
    await waitFor(() => byA.length === 1 && byB.length === 9, "a is stuck on one, b does the rest");
    const stopping = m.unsubscribe(a);
    release();
    await stopping;
    // a's handler returned: its message is acked, not handed on.
    expect(byB.length).toBe(9);
    await waitFor(() => m.openSubscriber("jobs2", "w").cursorOf("jobs2") === 11, "all acked");
    await m.unsubscribe(b);
    await m.close();
  });
});
