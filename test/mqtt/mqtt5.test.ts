/**
 * MQTT 5 features against a real agent, with mqtt.js as the client: what
 * a publisher says beyond its payload reaches subscribers unchanged,
 * subscribe options, subscription identifiers, topic aliases, QoS 2 to
 * subscribers, message expiry, unsubscribe reason codes.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import mqtt from "mqtt";
import type { IPublishPacket } from "mqtt-packet";
import { startTestAgent, waitFor, type TestAgent } from "../helpers.ts";

let t: TestAgent;
let port: number;
const open: mqtt.MqttClient[] = [];

beforeAll(async () => {
  t = await startTestAgent({ mqtt: { listen: "127.0.0.1:0", max_keepalive: "60s" } });
  port = t.agent.mqtt!.port!;
});
afterAll(async () => {
  for (const c of open) await c.endAsync(true).catch(() => undefined);
  await t.stop();
});

async function client(clientId: string, opts: mqtt.IClientOptions = {}): Promise<mqtt.MqttClient> {
  const c = await mqtt.connectAsync(`mqtt://127.0.0.1:${port}`, { protocolVersion: 5, clientId, clean: true, reconnectPeriod: 0, ...opts });
  open.push(c);
  return c;
}

/** Every PUBLISH the client gets, as mqtt.js read it. */
function collect(c: mqtt.MqttClient): IPublishPacket[] {
  const got: IPublishPacket[] = [];
  c.on("message", (_t, _p, packet) => got.push(packet));
  return got;
}

describe("MQTT 5", () => {
  test("user properties (in order, names repeating), content type, payload format, response topic and correlation data reach the subscriber unchanged", async () => {
    const sub = await client("props-sub");
    const got = collect(sub);
    await sub.subscribeAsync("props/t", { qos: 1 });
    const pub = await client("props-pub");
    await pub.publishAsync("props/t", "hello", {
      qos: 1,
      properties: {
        userProperties: { a: ["1", "3"], b: "2" },
        contentType: "text/plain",
        payloadFormatIndicator: true,
        responseTopic: "reply/to/me",
        correlationData: Buffer.from([0, 1, 2, 0xff]),
      },
    });
    await waitFor(() => got.length === 1, "the message");
    expect(got[0]!.payload.toString()).toBe("hello");
    expect(got[0]!.properties).toEqual({
      userProperties: { a: ["1", "3"], b: "2" },
      contentType: "text/plain",
      payloadFormatIndicator: true,
      responseTopic: "reply/to/me",
      correlationData: Buffer.from([0, 1, 2, 0xff]),
    });
    // And the HTTP API shows them in the stored envelope.
    const r = await t.call("GET", "/v1/channels/props.t/messages?subscriber=p5&from=earliest");
    const m = ((await r.json()) as { messages: Record<string, unknown>[] }).messages[0]!;
    expect(m).toMatchObject({
      content_type: "text/plain",
      reply_to: "reply.to.me",
      utf8: true,
      publisher: "props-pub",
      qos: 1,
      headers: [
        ["a", "1"],
        ["a", "3"],
        ["b", "2"],
      ],
    });
  });

  test("message expiry: an expired message is not delivered; one that is not goes with the remaining interval", async () => {
    const pub = await client("exp-pub");
    await pub.publishAsync("exp/short", "gone", { qos: 1, retain: false, properties: { messageExpiryInterval: 1 } });
    await pub.publishAsync("exp/long", "kept", { qos: 1, properties: { messageExpiryInterval: 3600 } });
    // A persistent session that subscribed before: it comes back after the short one expired.
    const first = await client("exp-sub", { clean: false, properties: { sessionExpiryInterval: 300 } });
    await first.subscribeAsync(["exp/short", "exp/long"], { qos: 1 });
    await first.endAsync();
    await pub.publishAsync("exp/short", "expires while away", { qos: 1, properties: { messageExpiryInterval: 1 } });
    await pub.publishAsync("exp/long", "waits", { qos: 1, properties: { messageExpiryInterval: 3600 } });
    const t0 = Date.now();
    await waitFor(() => Date.now() - t0 > 1100, "past the short expiry", 3000);
    // Listening before the CONNACK: what the session kept comes right after it.
    const again = mqtt.connect(`mqtt://127.0.0.1:${port}`, { protocolVersion: 5, clientId: "exp-sub", clean: false, reconnectPeriod: 0, properties: { sessionExpiryInterval: 300 } });
    open.push(again);
    const got = collect(again);
    await waitFor(() => got.length >= 1, "the message that did not expire");
    const marker = await client("exp-marker");
    await marker.publishAsync("exp/long", "marker", { qos: 1 });
    await waitFor(() => got.some((p) => p.payload.toString() === "marker"), "the marker");
    expect(got.map((p) => p.payload.toString())).toEqual(["waits", "marker"]);
    const interval = got[0]!.properties?.messageExpiryInterval ?? 0;
    expect(interval).toBeGreaterThan(3590);
    expect(interval).toBeLessThanOrEqual(3600);
    expect(got[1]!.properties?.messageExpiryInterval).toBeUndefined();
  });

  test("no local: a client does not get its own publishes back; retain as published keeps the RETAIN flag on live messages", async () => {
    const a = await client("nl-a");
    const b = await client("nl-b");
    const gotA = collect(a);
    const gotB = collect(b);
    await a.subscribeAsync("nl/t", { qos: 1, nl: true });
    await b.subscribeAsync("nl/t", { qos: 1, nl: true, rap: true });
    await a.publishAsync("nl/t", "from a", { qos: 1 });
    await a.publishAsync("nl/t", "from a, retained", { qos: 1, retain: true });
    await b.publishAsync("nl/t", "from b", { qos: 1 });
    await waitFor(() => gotA.length === 1 && gotB.length === 2, "a gets b's, b gets a's two");
    expect(gotA.map((p) => [p.payload.toString(), p.retain])).toEqual([["from b", false]]);
    expect(gotB.map((p) => [p.payload.toString(), p.retain])).toEqual([
      ["from a", false],
      ["from a, retained", true],
    ]);
    await a.publishAsync("nl/t", "", { qos: 1, retain: true });
  });

  test("subscription identifiers: each message carries the identifier of the subscription it matched", async () => {
    const c = await client("sid");
    const got = collect(c);
    await c.subscribeAsync("sid/a/+", { qos: 1, properties: { subscriptionIdentifier: 7 } });
    await c.subscribeAsync("sid/#", { qos: 0, properties: { subscriptionIdentifier: 300 } });
    const pub = await client("sid-pub");
    await pub.publishAsync("sid/a/x", "both", { qos: 1 });
    await pub.publishAsync("sid/b", "one", { qos: 1 });
    await waitFor(() => got.length === 3, "three deliveries");
    const seen = got.map((p) => `${p.payload}:${p.qos}:${p.properties?.subscriptionIdentifier}`).sort();
    expect(seen).toEqual(["both:0:300", "both:1:7", "one:0:300"]);
  });

  test("topic aliases from the client: set with a topic, then used with an empty one; an unknown alias ends the connection", async () => {
    const c = await client("alias-pub");
    const sub = await client("alias-sub");
    const got = collect(sub);
    await sub.subscribeAsync("alias/#", { qos: 1 });
    await c.publishAsync("alias/long/topic/name", "first", { qos: 1, properties: { topicAlias: 3 } });
    await c.publishAsync("", "second", { qos: 1, properties: { topicAlias: 3 } });
    await waitFor(() => got.length === 2, "both");
    expect(got.map((p) => `${p.topic}=${p.payload}`)).toEqual(["alias/long/topic/name=first", "alias/long/topic/name=second"]);
    const bad = await client("alias-bad");
    let closed = false;
    bad.on("close", () => (closed = true));
    bad.publish("", "x", { qos: 0, properties: { topicAlias: 9 } });
    await waitFor(() => closed, "the connection ends");
  });

  test("QoS 2 to subscribers, and overlapping subscriptions: one message per subscription at its own QoS", async () => {
    const c = await client("q2-sub");
    const got = collect(c);
    await c.subscribeAsync({ "q2/a/#": { qos: 2 }, "q2/a/+": { qos: 1 } });
    const pub = await client("q2-pub");
    await pub.publishAsync("q2/a/b", "overlap", { qos: 2 });
    await waitFor(() => got.length === 2, "two deliveries");
    expect(got.map((p) => p.qos).sort()).toEqual([1, 2]);
    // At no higher QoS than published.
    await pub.publishAsync("q2/a/c", "low", { qos: 0 });
    await waitFor(() => got.length === 4, "two more");
    expect(got.slice(2).map((p) => p.qos)).toEqual([0, 0]);
  });

  test("a persistent session that received a QoS 2 message (PUBREC) and went before PUBCOMP gets the PUBREL again, not the message", async () => {
    const { default: packet } = await import("mqtt-packet");
    const packets: Record<string, unknown>[] = [];
    const connectRaw = async () => {
      const parser = packet.parser({ protocolVersion: 5 });
      parser.on("packet", (p) => packets.push(p as unknown as Record<string, unknown>));
      const sock = await Bun.connect({ hostname: "127.0.0.1", port, socket: { data: (_s, d) => void parser.parse(Buffer.from(d)) } });
      const send = (p: Record<string, unknown>) => sock.write(packet.generate(p as never, { protocolVersion: 5 }));
      send({ cmd: "connect", protocolId: "MQTT", protocolVersion: 5, clean: false, clientId: "q2-persist", keepalive: 0, properties: { sessionExpiryInterval: 300 } });
      return { sock, send };
    };
    const first = await connectRaw();
    first.send({ cmd: "subscribe", messageId: 1, subscriptions: [{ topic: "q2p/t", qos: 2 }] });
    await waitFor(() => packets.some((p) => p.cmd === "suback"), "SUBACK");
    const pub = await client("q2p-pub");
    await pub.publishAsync("q2p/t", "once", { qos: 2 });
    const msg = (await waitFor(() => packets.find((p) => p.cmd === "publish"), "the message"))!;
    first.send({ cmd: "pubrec", messageId: msg.messageId });
    await waitFor(() => packets.some((p) => p.cmd === "pubrel"), "PUBREL");
    first.sock.end();
    await waitFor(() => t.agent.mqtt!.owner("q2-persist") === undefined, "the first connection gone");
    packets.length = 0;
    const second = await connectRaw();
    await waitFor(() => packets.some((p) => p.cmd === "pubrel"), "PUBREL again after the reconnect");
    expect(packets.find((p) => p.cmd === "pubrel")!.messageId).toBe(msg.messageId);
    second.send({ cmd: "pubcomp", messageId: msg.messageId });
    // A marker through the same subscription: the message itself did not come again.
    await pub.publishAsync("q2p/t", "marker", { qos: 2 });
    await waitFor(() => packets.some((p) => p.cmd === "publish"), "the marker");
    expect(packets.filter((p) => p.cmd === "publish").map((p) => String(p.payload))).toEqual(["marker"]);
    second.send({ cmd: "disconnect", properties: { sessionExpiryInterval: 0 } });
  });

  test("UNSUBSCRIBE answers each filter: success, no subscription existed, and the other subscriptions carry on", async () => {
    const { default: packet } = await import("mqtt-packet");
    const packets: Record<string, unknown>[] = [];
    const parser = packet.parser({ protocolVersion: 5 });
    parser.on("packet", (p) => packets.push(p as unknown as Record<string, unknown>));
    const sock = await Bun.connect({ hostname: "127.0.0.1", port, socket: { data: (_s, d) => void parser.parse(Buffer.from(d)) } });
    const send = (p: Record<string, unknown>) => sock.write(packet.generate(p as never, { protocolVersion: 5 }));
    send({ cmd: "connect", protocolId: "MQTT", protocolVersion: 5, clean: true, clientId: "unsub5", keepalive: 0 });
    send({
      cmd: "subscribe",
      messageId: 1,
      subscriptions: [
        { topic: "u5/a", qos: 1 },
        { topic: "u5/b", qos: 1 },
      ],
    });
    await waitFor(() => packets.some((p) => p.cmd === "suback"), "SUBACK");
    send({ cmd: "unsubscribe", messageId: 2, unsubscriptions: ["u5/a", "u5/none"] });
    const ack = (await waitFor(() => packets.find((p) => p.cmd === "unsuback"), "UNSUBACK"))!;
    expect(ack.granted).toEqual([0x00, 0x11]);
    const pub = await client("unsub5-pub");
    await pub.publishAsync("u5/a", "after", { qos: 0 });
    await pub.publishAsync("u5/b", "still", { qos: 0 });
    await waitFor(() => packets.some((p) => p.cmd === "publish"), "the message of the kept subscription");
    await pub.publishAsync("u5/b", "marker", { qos: 0 });
    await waitFor(() => packets.filter((p) => p.cmd === "publish").length >= 2, "the marker");
    expect(packets.filter((p) => p.cmd === "publish").map((p) => `${p.topic}=${p.payload}`)).toEqual(["u5/b=still", "u5/b=marker"]);
    sock.end();
  });
});

/** A raw MQTT 5 connection: every packet it gets, parsed; `send` writes one. */
async function raw5(connect: Record<string, unknown>) {
  const { default: packet } = await import("mqtt-packet");
  const packets: Record<string, any>[] = [];
  const parser = packet.parser({ protocolVersion: 5 });
  parser.on("packet", (p) => packets.push(p as unknown as Record<string, unknown>));
  let closed = false;
  const sock = await Bun.connect({ hostname: "127.0.0.1", port, socket: { data: (_s, d) => void parser.parse(Buffer.from(d)), close: () => void (closed = true) } });
  const send = (p: Record<string, unknown>) => sock.write(packet.generate(p as never, { protocolVersion: 5 }));
  send({ cmd: "connect", protocolId: "MQTT", protocolVersion: 5, clean: true, keepalive: 0, ...connect });
  await waitFor(() => packets.some((p) => p.cmd === "connack"), "CONNACK");
  return { packets, send, sock, closed: () => closed };
}

describe("MQTT 5 sessions", () => {
  test("will delay: published after the delay; not at all when the client is back before it", async () => {
    const watcher = await client("wd-watch");
    const got = collect(watcher);
    await watcher.subscribeAsync("wd/#", { qos: 1 });
    const will = (topic: string) => ({ topic, payload: Buffer.from("gone"), qos: 1 as const, retain: false, properties: { willDelayInterval: 1 } });
    const a = await raw5({ clientId: "wd-a", will: will("wd/a"), properties: { sessionExpiryInterval: 60 } });
    const t0 = Date.now();
    a.sock.terminate();
    await waitFor(() => got.length === 1, "the delayed will", 5000);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(900);
    expect(got[0]!.topic).toBe("wd/a");
    // Back within the delay: no will.
    const b = await raw5({ clientId: "wd-b", will: will("wd/b"), properties: { sessionExpiryInterval: 60 } });
    b.sock.terminate();
    await waitFor(() => t.agent.mqtt!.owner("wd-b") === undefined, "b gone");
    const again = await raw5({ clientId: "wd-b", clean: false, properties: { sessionExpiryInterval: 60 } });
    const marker = await client("wd-marker");
    const t1 = Date.now();
    await waitFor(() => Date.now() - t1 > 1500, "past b's will delay", 3000);
    await marker.publishAsync("wd/marker", "m", { qos: 1 });
    await waitFor(() => got.some((p) => p.topic === "wd/marker"), "the marker");
    expect(got.map((p) => p.topic)).toEqual(["wd/a", "wd/marker"]);
    again.send({ cmd: "disconnect", properties: { sessionExpiryInterval: 0 } });
  });

  test("server keep alive: a client asking for more than mqtt.max_keepalive is told the cap in CONNACK", async () => {
    const c = await raw5({ clientId: "ka", keepalive: 120 });
    expect(c.packets[0]!.properties.serverKeepAlive).toBe(60);
    const d = await raw5({ clientId: "ka2", keepalive: 30 });
    expect(d.packets[0]!.properties.serverKeepAlive).toBeUndefined();
    c.sock.end();
    d.sock.end();
  });

  test("a refusal says why in a reason string; a client that asks for no problem information gets none", async () => {
    const c = await raw5({ clientId: "rs" });
    c.send({ cmd: "publish", topic: "rs/x", payload: Buffer.from("x"), qos: 0, retain: false, dup: false, properties: { topicAlias: 99 } });
    await waitFor(() => c.packets.some((p) => p.cmd === "disconnect"), "DISCONNECT");
    const d = c.packets.find((p) => p.cmd === "disconnect")!;
    expect(d.reasonCode).toBe(0x94);
    expect(d.properties.reasonString).toContain("topic alias 99");
    const quiet = await raw5({ clientId: "rs2", properties: { requestProblemInformation: false } });
    quiet.send({ cmd: "publish", topic: "rs/x", payload: Buffer.from("x"), qos: 0, retain: false, dup: false, properties: { topicAlias: 99 } });
    await waitFor(() => quiet.packets.some((p) => p.cmd === "disconnect"), "DISCONNECT");
    expect(quiet.packets.find((p) => p.cmd === "disconnect")!.properties?.reasonString).toBeUndefined();
  });

  test("topic aliases to the client: the first message of a topic sets one, the next carry only the alias", async () => {
    const c = await raw5({ clientId: "ta", properties: { topicAliasMaximum: 2 } });
    c.send({ cmd: "subscribe", messageId: 1, subscriptions: [{ topic: "ta/#", qos: 0 }] });
    await waitFor(() => c.packets.some((p) => p.cmd === "suback"), "SUBACK");
    const pub = await client("ta-pub");
    for (const topic of ["ta/long/name", "ta/long/name", "ta/other", "ta/third", "ta/third"]) await pub.publishAsync(topic, "x", { qos: 1 });
    await waitFor(() => c.packets.filter((p) => p.cmd === "publish").length === 5, "five messages");
    const seen = c.packets.filter((p) => p.cmd === "publish").map((p) => [p.topic, p.properties?.topicAlias]);
    // Two aliases taken; the third topic goes by name every time.
    expect(seen).toEqual([
      ["ta/long/name", 1],
      ["", 1],
      ["ta/other", 2],
      ["ta/third", undefined],
      ["ta/third", undefined],
    ]);
    c.sock.end();
  });
});

describe("MQTT 5 receive maximum", () => {
  test("a client with more QoS 2 publishes unreleased than mqtt.receive_maximum is disconnected with 0x93", async () => {
    const small = await startTestAgent({ mqtt: { listen: "127.0.0.1:0", receive_maximum: 3 } });
    try {
      const { default: packet } = await import("mqtt-packet");
      const packets: Record<string, any>[] = [];
      const parser = packet.parser({ protocolVersion: 5 });
      parser.on("packet", (p) => packets.push(p as unknown as Record<string, unknown>));
      const sock = await Bun.connect({ hostname: "127.0.0.1", port: small.agent.mqtt!.port!, socket: { data: (_s, d) => void parser.parse(Buffer.from(d)) } });
      const send = (p: Record<string, unknown>) => sock.write(packet.generate(p as never, { protocolVersion: 5 }));
      send({ cmd: "connect", protocolId: "MQTT", protocolVersion: 5, clean: true, keepalive: 0, clientId: "rm" });
      await waitFor(() => packets.some((p) => p.cmd === "connack"), "CONNACK");
      expect(packets[0]!.properties.receiveMaximum).toBe(3);
      // Three unreleased (no PUBREL) are allowed; the fourth is one too many.
      for (let id = 1; id <= 3; id++) send({ cmd: "publish", topic: "rm/t", payload: Buffer.from("x"), qos: 2, messageId: id, retain: false, dup: false });
      await waitFor(() => packets.filter((p) => p.cmd === "pubrec").length === 3, "three PUBRECs");
      expect(packets.some((p) => p.cmd === "disconnect")).toBe(false);
      send({ cmd: "publish", topic: "rm/t", payload: Buffer.from("x"), qos: 2, messageId: 4, retain: false, dup: false });
      const d = (await waitFor(() => packets.find((p) => p.cmd === "disconnect"), "DISCONNECT"))!;
      expect(d.reasonCode).toBe(0x93);
      sock.end();
    } finally {
      await small.stop();
    }
  });
});

describe("MQTT 5 shared subscriptions", () => {
  test("$share/<group>/<filter>: each message to one member, in turn; a plain subscription beside it gets every one", async () => {
    const a = await client("sh-a");
    const b = await client("sh-b");
    const gotA = collect(a);
    const gotB = collect(b);
    await a.subscribeAsync(["$share/workers/sh/jobs", "sh/all"], { qos: 1 });
    await b.subscribeAsync(["$share/workers/sh/jobs", "sh/all"], { qos: 1 });
    const pub = await client("sh-pub");
    for (let i = 0; i < 10; i++) await pub.publishAsync("sh/jobs", `job ${i}`, { qos: 1 });
    await pub.publishAsync("sh/all", "everyone", { qos: 1 });
    await waitFor(() => gotA.length + gotB.length === 12, "ten jobs once and the plain message twice");
    const jobs = [...gotA, ...gotB].filter((p) => p.topic === "sh/jobs").map((p) => p.payload.toString());
    expect(jobs.sort()).toEqual(Array.from({ length: 10 }, (_, i) => `job ${i}`).sort());
    // Both members worked.
    expect(gotA.filter((p) => p.topic === "sh/jobs").length).toBeGreaterThan(0);
    expect(gotB.filter((p) => p.topic === "sh/jobs").length).toBeGreaterThan(0);
    expect([...gotA, ...gotB].filter((p) => p.topic === "sh/all")).toHaveLength(2);
    // The group's place in the log is one durable subscriber.
    expect(t.agent.messenger.subscribers().some((s) => s.name === "mqtt-share.workers" && s.pattern === "sh.jobs")).toBe(true);
  });

  test("a member that goes with messages unacknowledged: they go to another member; the last member's going ends the group", async () => {
    const { default: packet } = await import("mqtt-packet");
    // A raw member that never acknowledges, with room for 3.
    const rawGot: string[] = [];
    const parser = packet.parser({ protocolVersion: 5 });
    parser.on("packet", (p) => p.cmd === "publish" && rawGot.push(String(p.payload)));
    let subacked = false;
    parser.on("packet", (p) => p.cmd === "suback" && (subacked = true));
    const sock = await Bun.connect({ hostname: "127.0.0.1", port, socket: { data: (_s, d) => void parser.parse(Buffer.from(d)) } });
    const send = (p: Record<string, unknown>) => sock.write(packet.generate(p as never, { protocolVersion: 5 }));
    send({ cmd: "connect", protocolId: "MQTT", protocolVersion: 5, clean: true, clientId: "sh-lazy", keepalive: 0, properties: { receiveMaximum: 3 } });
    send({ cmd: "subscribe", messageId: 1, subscriptions: [{ topic: "$share/g2/sh2/jobs", qos: 1 }] });
    await waitFor(() => subacked, "SUBACK");
    const pub = await client("sh2-pub");
    for (let i = 0; i < 3; i++) await pub.publishAsync("sh2/jobs", `job ${i}`, { qos: 1 });
    await waitFor(() => rawGot.length === 3, "the lazy member holds three");
    const good = await client("sh2-good");
    const got = collect(good);
    await good.subscribeAsync("$share/g2/sh2/jobs", { qos: 1 });
    await pub.publishAsync("sh2/jobs", "job 3", { qos: 1 });
    await waitFor(() => got.length === 1, "the new member gets the next one (the lazy one has no room)");
    sock.end();
    await waitFor(() => got.length === 4, "the three it held go to the other member");
    expect(got.map((p) => p.payload.toString()).sort()).toEqual(["job 0", "job 1", "job 2", "job 3"]);
    await good.unsubscribeAsync("$share/g2/sh2/jobs");
    await waitFor(() => !t.agent.messenger.subscribers().some((s) => s.name === "mqtt-share.g2"), "the group's subscriber deleted");
  });

  test("an MQTT member and an HTTP stream on the group's subscriber share one queue group", async () => {
    const m = await client("sh3-mqtt");
    const got = collect(m);
    await m.subscribeAsync("$share/mixed/sh3/jobs", { qos: 1 });
    // The same group seen from the HTTP API: subscriber mqtt-share.mixed on sh3.jobs, with queue=true.
    const ctl = new AbortController();
    const res = await fetch("http://k/v1/channels/sh3.jobs/stream?subscriber=mqtt-share.mixed&queue=true&max_inflight=1", { unix: t.socket, signal: ctl.signal } as RequestInit);
    expect(res.status).toBe(200);
    const httpGot: number[] = [];
    const reading = (async () => {
      const dec = new TextDecoder();
      try {
        for await (const chunk of res.body as AsyncIterable<Uint8Array>)
          for (const line of dec.decode(chunk).split("\n"))
            if (line.trim()) {
              const e = JSON.parse(line);
              httpGot.push(e.seq);
              await t.call("POST", "/v1/channels/sh3.jobs/subscribers/mqtt-share.mixed/ack", JSON.stringify({ seq: e.seq }));
            }
      } catch {
        // aborted
      }
    })();
    const pub = await client("sh3-pub");
    for (let i = 0; i < 20; i++) await pub.publishAsync("sh3/jobs", `job ${i}`, { qos: 1 });
    await waitFor(() => got.length + httpGot.length === 20, "twenty jobs, once each");
    expect(got.length).toBeGreaterThan(0);
    expect(httpGot.length).toBeGreaterThan(0);
    expect(t.agent.messenger.queues.get("sh3.jobs", "mqtt-share.mixed")?.size).toBe(2);
    // An exclusive stream may not take the group's subscriber over.
    expect((await t.call("GET", "/v1/channels/sh3.jobs/stream?subscriber=mqtt-share.mixed")).status).toBe(409);
    ctl.abort();
    await reading;
  });

  test("a malformed $share filter is refused with 0x8F", async () => {
    const { default: packet } = await import("mqtt-packet");
    const packets: Record<string, unknown>[] = [];
    const parser = packet.parser({ protocolVersion: 5 });
    parser.on("packet", (p) => packets.push(p as unknown as Record<string, unknown>));
    const sock = await Bun.connect({ hostname: "127.0.0.1", port, socket: { data: (_s, d) => void parser.parse(Buffer.from(d)) } });
    const send = (p: Record<string, unknown>) => sock.write(packet.generate(p as never, { protocolVersion: 5 }));
    send({ cmd: "connect", protocolId: "MQTT", protocolVersion: 5, clean: true, clientId: "sh-bad", keepalive: 0 });
    const filters = ["$share/onlygroup", "$share//x", "$share/g+/x", "$share/g/"];
    send({ cmd: "subscribe", messageId: 1, subscriptions: filters.map((topic) => ({ topic, qos: 1 })) });
    const ack = (await waitFor(() => packets.find((p) => p.cmd === "suback"), "SUBACK"))!;
    expect(ack.granted).toEqual([0x8f, 0x8f, 0x8f, 0x8f]);
    sock.end();
  });
});
