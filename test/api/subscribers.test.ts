import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startTestAgent, type TestAgent } from "../helpers.ts";

let a: TestAgent;
beforeAll(async () => {
  a = await startTestAgent();
});
afterAll(() => a.stop());

const pub = (ch: string, payload: unknown) => a.call("POST", `/v1/channels/${ch}/messages`, JSON.stringify({ type: "t", payload }));
const pull = async (path: string) => {
  const r = await a.call("GET", path);
  return { status: r.status, body: (await r.json()) as any };
};
const ack = (path: string, body: unknown) => a.call("POST", path, JSON.stringify(body));

describe("pull, ack, delete", () => {
  test("a new subscriber starts at latest; from=earliest replays; unacked come again; acks are cumulative", async () => {
    for (let i = 1; i <= 5; i++) await pub("p.a", i);
    expect((await pull("/v1/channels/p.a/messages?subscriber=late")).body.messages).toEqual([]);
    let r = await pull("/v1/channels/p.a/messages?subscriber=s1&from=earliest&max=2");
    expect(r.body.messages.map((m: any) => m.payload)).toEqual([1, 2]);
    r = await pull("/v1/channels/p.a/messages?subscriber=s1&max=2");
    expect(r.body.messages.map((m: any) => m.payload)).toEqual([1, 2]); // not acked: same again
    let res = await ack("/v1/channels/p.a/subscribers/s1/ack", { seq: 3 });
    expect(res.status).toBe(200);
    expect(((await res.json()) as any).cursor).toBe(4);
    r = await pull("/v1/channels/p.a/messages?subscriber=s1");
    expect(r.body.messages.map((m: any) => m.seq)).toEqual([4, 5]);
    // an older ack does not move the cursor back
    res = await ack("/v1/channels/p.a/subscribers/s1/ack", { seq: 1 });
    expect(((await res.json()) as any).cursor).toBe(4);
  });

  test("long-poll: wait returns as soon as a message arrives, or empty at the deadline", async () => {
    const t0 = performance.now();
    const waiting = pull("/v1/channels/p.wait/messages?subscriber=w&wait=20000");
    await Bun.sleep(50);
    await pub("p.wait", "hello");
    const r = await waiting;
    expect(r.body.messages.map((m: any) => m.payload)).toEqual(["hello"]);
    expect(performance.now() - t0).toBeLessThan(15_000);
    const e = await pull("/v1/channels/p.empty/messages?subscriber=w&wait=100");
    expect(e.body.messages).toEqual([]);
  });

  test("patterns: pull across channels, ack names the channel", async () => {
    await pub("pat.a", "a1");
    await pub("pat.b", "b1");
    let r = await pull("/v1/channels/pat.%3E/messages?subscriber=ps&from=earliest");
    expect(r.body.messages.map((m: any) => `${m.channel}:${m.payload}`).sort()).toEqual(["pat.a:a1", "pat.b:b1"]);
    const noChannel = await ack("/v1/channels/pat.%3E/subscribers/ps/ack", { seq: 1 });
    expect(noChannel.status).toBe(400);
    expect((await ack("/v1/channels/pat.%3E/subscribers/ps/ack", { seq: 1, channel: "pat.a" })).status).toBe(200);
    // acking on the concrete channel finds the single pattern subscriber of that name
    expect((await ack("/v1/channels/pat.b/subscribers/ps/ack", { seq: 1 })).status).toBe(200);
    r = await pull("/v1/channels/pat.%3E/messages?subscriber=ps");
    expect(r.body.messages).toEqual([]);
  });

  test("errors: unknown subscriber 404, seq past the end 400, bad params 400, bad name 400", async () => {
    await pub("p.err", 1);
    let res = await ack("/v1/channels/p.err/subscribers/nobody/ack", { seq: 1 });
    expect(res.status).toBe(404);
    expect(((await res.json()) as any).error.code).toBe("unknown_subscriber");
    await pull("/v1/channels/p.err/messages?subscriber=e1&from=earliest");
    res = await ack("/v1/channels/p.err/subscribers/e1/ack", { seq: 99 });
    expect(res.status).toBe(400);
    expect((await ack("/v1/channels/p.err/subscribers/e1/ack", { seq: "1" })).status).toBe(400);
    expect((await a.call("POST", "/v1/channels/p.err/subscribers/e1/ack", "nope")).status).toBe(400);
    expect((await pull("/v1/channels/p.err/messages")).status).toBe(400);
    expect((await pull("/v1/channels/p.err/messages?subscriber=e1&max=0")).status).toBe(400);
    expect((await pull("/v1/channels/p.err/messages?subscriber=e1&wait=abc")).status).toBe(400);
    expect((await pull("/v1/channels/p.err/messages?subscriber=e1&from=never")).status).toBe(400);
    expect((await pull("/v1/channels/p.err/messages?subscriber=..%2Fx")).status).toBe(400);
  });

  test("delete removes the subscriber; a second delete is 404", async () => {
    await pub("p.del", 1);
    await pull("/v1/channels/p.del/messages?subscriber=d1&from=earliest");
    expect((await a.call("DELETE", "/v1/channels/p.del/subscribers/d1")).status).toBe(200);
    expect((await a.call("DELETE", "/v1/channels/p.del/subscribers/d1")).status).toBe(404);
    // re-created fresh at latest
    expect((await pull("/v1/channels/p.del/messages?subscriber=d1")).body.messages).toEqual([]);
  });
});
