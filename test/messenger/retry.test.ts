import { describe, expect, test } from "bun:test";
import { Messenger, RetryLater, type Message } from "../../src/index.ts";
import { tmpDir, waitFor } from "../helpers.ts";

const open = () =>
  Messenger.open({
    name: "dev1",
    storage: { dataDir: tmpDir() },
    subscribers: { maxRetries: 3, retryBackoffBaseMs: 5, retryBackoffMaxMs: 20 },
  });

describe("retries and dead letters", () => {
  test("a failing handler is retried with backoff, then the message goes to <channel>.dead-letter and delivery moves on", async () => {
    const m = await open();
    const calls: { payload: unknown; at: number }[] = [];
    const dead: Message<any>[] = [];
    await m.subscribe("orders.dead-letter", "dl", (msg) => void dead.push(msg as Message<any>));
    await m.subscribe("orders", "proc", (msg) => {
      calls.push({ payload: msg.payload, at: performance.now() });
      if (msg.payload === "poison") throw new Error("cannot process");
    });
    await m.publish("orders", "order", "poison", { correlationId: "corr-9" });
    await m.publish("orders", "order", "fine");
    await waitFor(() => dead.length === 1 && calls.some((c) => c.payload === "fine"), "dead letter and next message");
    const poison = calls.filter((c) => c.payload === "poison");
    expect(poison.length).toBe(3);
    // backoff doubles: 5 ms then 10 ms between attempts
    expect(poison[1]!.at - poison[0]!.at).toBeGreaterThanOrEqual(4);
    expect(poison[2]!.at - poison[1]!.at).toBeGreaterThanOrEqual(9);
    expect(calls.at(-1)!.payload).toBe("fine");
    const dl = dead[0]!;
    expect(dl.channel).toBe("orders.dead-letter");
    expect(dl.type).toBe("keyop.dead-letter");
    expect(dl.correlationId).toBe("corr-9");
    expect(dl.payload).toMatchObject({ error: "cannot process", attempts: 3, message: { channel: "orders", seq: 1, payload: "poison", correlation_id: "corr-9" } });
    const st = m.stats().channels.find((c) => c.channel === "orders")!;
    expect(st).toMatchObject({ deadLettered: 1, failed: 3, delivered: 1 });
    await m.close();
  });

  test("RetryLater keeps the place without spending retries", async () => {
    const m = await open();
    let n = 0;
    const done: unknown[] = [];
    await m.subscribe("c", "s", (msg) => {
      n++;
      if (n <= 10) throw new RetryLater(1);
      done.push(msg.payload);
    });
    await m.publish("c", "t", "a");
    await m.publish("c", "t", "b");
    await waitFor(() => done.length === 2, "both delivered");
    expect(done).toEqual(["a", "b"]);
    expect(n).toBe(12);
    const st = m.stats().channels.find((c) => c.channel === "c")!;
    expect(st.deadLettered).toBe(0);
    expect(st.failed).toBe(0);
    expect(st.redelivered).toBe(1);
    await m.close();
  });

  test("a registered decoder types the payload; a payload it rejects is dead-lettered at once", async () => {
    const m = await open();
    m.registerPayloadType("temp", (p) => {
      const v = p as { c?: unknown };
      if (typeof v?.c !== "number") throw new Error("c must be a number");
      return { celsius: v.c };
    });
    expect(m.payloadTypes).toEqual(["temp"]);
    const got: unknown[] = [];
    const dead: Message<any>[] = [];
    let handlerCalls = 0;
    await m.subscribe("t.dead-letter", "dl", (msg) => void dead.push(msg as Message<any>));
    await m.subscribe("t", "s", (msg) => {
      handlerCalls++;
      got.push(msg.payload);
    });
    await m.publish("t", "temp", { c: "warm" });
    await m.publish("t", "temp", { c: 21 });
    await m.publish("t", "other", "untouched");
    await waitFor(() => got.length === 2 && dead.length === 1, "deliveries");
    expect(got).toEqual([{ celsius: 21 }, "untouched"]);
    expect(handlerCalls).toBe(2);
    expect(dead[0]!.payload).toMatchObject({ code: "decode_failed", attempts: 1, message: { payload: { c: "warm" } } });
    await m.close();
  });

  test("a failing dead-letter subscriber does not create dead letters of dead letters", async () => {
    const m = await open();
    let dlCalls = 0;
    await m.subscribe("x.dead-letter", "dl", () => {
      dlCalls++;
      throw new Error("also broken");
    });
    await m.subscribe("x", "s", () => {
      throw new Error("broken");
    });
    await m.publish("x", "t", 1);
    await waitFor(() => dlCalls === 3, "dead letter handler retried");
    await waitFor(() => m.stats().channels.find((c) => c.channel === "x.dead-letter")?.subscribers[0]?.lag === 0, "dead letter consumed");
    expect(
      m
        .stats()
        .channels.map((c) => c.channel)
        .sort(),
    ).toEqual(["x", "x.dead-letter"]);
    await m.close();
  });
});
