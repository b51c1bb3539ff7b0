/**
 * Request/reply in one messenger: a request carries reply_to (an inbox)
 * and its correlation id; the reply carries the request's id, goes to the
 * one requester and is never stored.
 */
import { describe, expect, test } from "bun:test";
import { Messenger, NoRequestError, NoRespondersError, RequestTimeoutError, type Message } from "../../src/index.ts";
import { tmpDir, waitFor } from "../helpers.ts";

const open = () => Messenger.open({ name: "hub", storage: { dataDir: tmpDir() } });

describe("request/reply", () => {
  test("a responder's return value is the reply; ids and correlation tie them together; nothing of the reply is stored", async () => {
    const m = await open();
    let seen: Message | undefined;
    await m.respond<{ n: number }>("svc.double", (msg) => {
      seen = msg;
      return { doubled: msg.payload.n * 2 };
    });
    const reply = await m.request("svc.double", "ask", { n: 21 }, { correlationId: "job-7", timeoutMs: 2000 });
    expect(reply.payload).toEqual({ doubled: 42 });
    expect(reply.type).toBe("reply");
    expect(reply.correlationId).toBe(seen!.id);
    expect(seen!.correlationId).toBe("job-7");
    expect(seen!.replyTo).toMatch(/^_inbox\./);
    expect(reply.channel).toBe(seen!.replyTo!);
    // Only the request is in a log; inboxes are not channels.
    expect(m.stats().channels.map((c) => c.channel)).toEqual(["svc.double"]);
    await m.close();
  });

  test("a handler answers with reply(); concurrent requests each get their own reply", async () => {
    const m = await open();
    await m.subscribe<number>("svc.sq", "worker", async (msg) => {
      await m.reply(msg, "square", msg.payload * msg.payload);
    });
    const replies = await Promise.all([1, 2, 3, 4, 5].map((n) => m.request("svc.sq", "n", n)));
    expect(replies.map((r) => r.payload)).toEqual([1, 4, 9, 16, 25]);
    await m.close();
  });

  test("no_responders at once when nobody is attached; timeout when nobody answers; a durable request waits for a responder that comes later", async () => {
    const m = await open();
    const t0 = performance.now();
    await expect(m.request("svc.none", "ask", 1)).rejects.toBeInstanceOf(NoRespondersError);
    expect(performance.now() - t0).toBeLessThan(100);
    // Attached but silent: the request times out, and expires with the wait.
    await m.subscribe("svc.mute", "mute", () => {});
    const err = await m.request("svc.mute", "ask", 1, { timeoutMs: 100 }).catch((e) => e);
    expect(err).toBeInstanceOf(RequestTimeoutError);
    expect(err.code).toBe("timeout");
    const late = m.request("svc.later", "ask", 5, { durable: true, timeoutMs: 5000 });
    await waitFor(() => m.stats().channels.some((c) => c.channel === "svc.later"), "the durable request stored");
    await m.respond<number>("svc.later", (msg) => msg.payload + 1, { name: "late" });
    // A responder made after the request starts at the latest message: this one reads from the start.
    await m.subscribe<number>("svc.later", "backfill", (msg) => void m.reply(msg, "n", msg.payload + 100).catch(() => {}), { from: "earliest" });
    expect((await late).payload).toBe(105);
    await m.close();
  });

  test("a reply to an inbox nobody waits on is refused (no_request), and a message without reply_to cannot be answered", async () => {
    const m = await open();
    await expect(m.publish("_inbox.0193-nobody", "r", 1)).rejects.toBeInstanceOf(NoRequestError);
    await m.publish("plain.x", "n", 1);
    const [msg] = await m.openSubscriber("plain.x", "p", { from: "earliest" }).fetch({ max: 1 });
    expect(() => m.reply(msg!, "r", 1)).toThrow(/no reply_to/);
    await expect(m.publishBatch([{ channel: "_inbox.x", type: "r", payload: 1 }])).rejects.toThrow(/on its own/);
    await expect(m.ingest("_inbox.x", [])).rejects.toThrow(/inbox/);
    await m.close();
  });

  test("a request waiting when the messenger closes is ended with closed", async () => {
    const m = await open();
    await m.subscribe("svc.mute", "mute", () => {});
    const waiting = m.request("svc.mute", "ask", 1, { timeoutMs: 10_000 }).catch((e) => e);
    await waitFor(() => m.stats().channels.some((c) => c.channel === "svc.mute"), "stored");
    await m.close();
    expect((await waiting).code).toBe("closed");
  });
});
