import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import mqtt from "mqtt-packet";
import mqttjs from "mqtt";
import type { IPublishPacket, Packet } from "mqtt-packet";
import { MqttSession, sessionName } from "../../src/mqtt/session.ts";
import { join } from "node:path";
import { startTestAgent, tmpDir, waitFor, type TestAgent } from "../helpers.ts";

let t: TestAgent;
let port: number;

beforeAll(async () => {
  t = await startTestAgent({ mqtt: { listen: "127.0.0.1:0" } });
  port = t.agent.mqtt!.port!;
});
afterAll(() => t.stop());

/** A raw TCP client: writes whole byte strings, parses what comes back, counts the reads. */
async function raw(): Promise<{ send: (...p: Packet[]) => void; end: () => void; packets: Packet[]; reads: () => number; acksPerRead: number[]; closed: () => boolean }> {
  const packets: Packet[] = [];
  /** PUBACKs in each read that had any, in order. */
  const acksPerRead: number[] = [];
  const parser = mqtt.parser({ protocolVersion: 4 });
  parser.on("packet", (p) => packets.push(p));
  let reads = 0;
  let closed = false;
  const sock = await Bun.connect({
    hostname: "127.0.0.1",
    port,
    socket: {
      data(_s, d) {
        reads++;
        const before = packets.length;
        parser.parse(Buffer.from(d));
        const acks = packets.slice(before).filter((p) => p.cmd === "puback").length;
        if (acks > 0) acksPerRead.push(acks);
      },
      close() {
        closed = true;
      },
    },
  });
  return {
    // All packets of one call in one write: the server sees them in one read.
    send: (...ps) => void sock.write(Buffer.concat(ps.map((p) => mqtt.generate(p)))),
    end: () => sock.end(),
    packets,
    reads: () => reads,
    acksPerRead,
    closed: () => closed,
  };
}

const connect = (clientId: string, extra: Partial<mqtt.IConnectPacket> = {}): Packet =>
  ({ cmd: "connect", protocolId: "MQTT", protocolVersion: 4, clean: true, clientId, keepalive: 0, ...extra }) as Packet;

async function stored(channel: string): Promise<string[]> {
  const r = await t.call("GET", `/v1/channels/${channel}/messages?subscriber=check-${Math.random().toString(36).slice(2)}&from=earliest`);
  if (r.status === 404) return [];
  return ((await r.json()) as { messages: { payload: string }[] }).messages.map((m) => m.payload);
}

describe("MQTT listener, raw packets", () => {
  test("a window of 64 QoS 1 publishes in one read: stored in two halves of one fdatasync each (four at most), 64 PUBACKs in order, in far fewer writes, and all 64 stored in order", async () => {
    const c = await raw();
    const pubs = Array.from({ length: 64 }, (_, i): Packet => ({ cmd: "publish", topic: "raw/window", payload: Buffer.from(`m${i}`), qos: 1, messageId: i + 1, retain: false, dup: false }) as Packet);
    const fsyncs = async () => Number(/\nkeyop_fsync_duration_seconds_count (\d+)/.exec(await (await t.call("GET", "/metrics")).text())?.[1] ?? Number.NaN);
    // The channel first (its log opens once, and publishes that wait for that share a commit anyway).
    c.send(connect("window"), { cmd: "publish", topic: "raw/window", payload: Buffer.from("first"), qos: 1, messageId: 1000, retain: false, dup: false } as Packet);
    await waitFor(() => c.packets.some((p) => p.cmd === "puback"), "the first PUBACK");
    const before = await fsyncs();
    const reads = c.reads();
    c.send(...pubs);
    await waitFor(() => c.packets.filter((p) => p.cmd === "puback").length === 65, "64 more PUBACKs");
    // Two groups of 32, a write and an fdatasync each (in groups of 16 it took four); more only if
    // the kernel handed the window over in more reads.
    expect((await fsyncs()) - before).toBeLessThanOrEqual(4);
    expect(c.packets[0]!.cmd).toBe("connack");
    expect(c.packets.slice(2).map((p) => (p as { messageId: number }).messageId)).toEqual(pubs.map((p) => (p as { messageId: number }).messageId));
    // Acks of one group commit share a socket write (one per packet would be 64 reads).
    expect(c.reads() - reads).toBeLessThanOrEqual(4);
    expect(await stored("raw.window")).toEqual(["first", ...pubs.map((_, i) => `m${i}`)]);
    c.end();
  });

  test("a window of 64 in one read: the first half's PUBACKs are written before the second half is stored, so the client can send on meanwhile", async () => {
    const c = await raw();
    const pubs = Array.from({ length: 64 }, (_, i): Packet => ({ cmd: "publish", topic: "raw/halves", payload: Buffer.from(`h${i}`), qos: 1, messageId: i + 1, retain: false, dup: false }) as Packet);
    c.send(connect("halves"), { cmd: "publish", topic: "raw/halves", payload: Buffer.from("first"), qos: 1, messageId: 1000, retain: false, dup: false } as Packet);
    await waitFor(() => c.packets.some((p) => p.cmd === "puback"), "the first PUBACK");
    const from = c.acksPerRead.length;
    c.send(...pubs);
    await waitFor(() => c.packets.filter((p) => p.cmd === "puback").length === 65, "64 more PUBACKs");
    // The first group's acknowledgements came on their own, before the second group's commit.
    // (This process's event loop reads between the agent's turns, so a read holds what the agent had
    // written by then: the first group's flush comes in the turn before the second group is written.)
    expect(c.acksPerRead[from]).toBe(32);
    expect(c.packets.slice(2).map((p) => (p as { messageId: number }).messageId)).toEqual(pubs.map((p) => (p as { messageId: number }).messageId));
    expect(await stored("raw.halves")).toEqual(["first", ...pubs.map((_, i) => `h${i}`)]);
    c.end();
  });

  test("publishes of every kind in one read from two clients: each stored with its own QoS, retain flag and publisher (the metadata of property-less publishes is shared per QoS)", async () => {
    const a = await raw();
    const b = await raw();
    const kinds: [qos: 0 | 1 | 2, retain: boolean][] = [
      [1, false],
      [0, false],
      [1, true],
      [1, false],
      [2, false],
      [0, false],
      [1, false],
      [0, true],
      [1, false],
    ];
    const pubs = (who: string) =>
      kinds.map(([qos, retain], i): Packet => ({ cmd: "publish", topic: "raw/kinds", payload: Buffer.from(`${who}${i}`), qos, messageId: qos > 0 ? i + 1 : undefined, retain, dup: false }) as Packet);
    a.send(connect("kinds-a"), ...pubs("a"));
    b.send(connect("kinds-b"), ...pubs("b"));
    const acked = (c: typeof a) => c.packets.filter((p) => p.cmd === "puback" || p.cmd === "pubrec").length;
    const wanted = kinds.filter(([q]) => q > 0).length;
    await waitFor(() => acked(a) === wanted && acked(b) === wanted, "the PUBACKs and PUBRECs");
    for (const c of [a, b]) c.send({ cmd: "pubrel", messageId: 5 } as Packet);
    await waitFor(() => a.packets.some((p) => p.cmd === "pubcomp") && b.packets.some((p) => p.cmd === "pubcomp"), "the PUBCOMPs");
    const r = await t.call("GET", `/v1/channels/raw.kinds/messages?subscriber=kinds-check&from=earliest&limit=100`);
    const got = ((await r.json()) as { messages: { payload: string; qos?: number; retain?: boolean; publisher?: string }[] }).messages;
    expect(got.length).toBe(2 * kinds.length);
    for (const m of got) {
      const who = m.payload[0]!;
      const [qos, retain] = kinds[Number(m.payload.slice(1))]!;
      expect({ payload: m.payload, qos: m.qos, retain: m.retain ?? false, publisher: m.publisher }).toEqual({ payload: m.payload, qos, retain, publisher: `kinds-${who}` });
    }
    a.end();
    b.end();
  });

  test("one client publishing to more topics than its session remembers, another receiving them: each message on its topic's channel and topic, a bad topic still refused", async () => {
    const sub = await raw();
    sub.send(connect("many-topics-sub"), { cmd: "subscribe", messageId: 1, subscriptions: [{ topic: "raw/many/#", qos: 0 }] } as Packet);
    await waitFor(() => sub.packets.some((p) => p.cmd === "suback"), "SUBACK");
    const c = await raw();
    // 100 topics (past the 64 a session keeps, either way), each twice, apart: every one is looked up again after it was dropped.
    const topics = Array.from({ length: 100 }, (_, i) => `raw/many/t${i}`);
    const pubs = [...topics, ...topics].map((topic, i): Packet => ({ cmd: "publish", topic, payload: Buffer.from(`m${i}`), qos: 1, messageId: i + 1, retain: false, dup: false }) as Packet);
    c.send(connect("many-topics"), ...pubs);
    await waitFor(() => c.packets.filter((p) => p.cmd === "puback").length === 200, "200 PUBACKs");
    for (const i of [0, 63, 64, 65, 99]) expect(await stored(`raw.many.t${i}`)).toEqual([`m${i}`, `m${i + 100}`]);
    await waitFor(() => sub.packets.filter((p) => p.cmd === "publish").length === 200, "200 PUBLISHes at the subscriber");
    const got = sub.packets.filter((p) => p.cmd === "publish").map((p) => `${(p as IPublishPacket).topic} ${String((p as IPublishPacket).payload)}`);
    expect(got.sort()).toEqual([...topics, ...topics].map((topic, i) => `${topic} m${i}`).sort());
    sub.end();
    c.send({ cmd: "publish", topic: "raw/+/bad", payload: Buffer.from("x"), qos: 1, messageId: 201, retain: false, dup: false } as Packet);
    await waitFor(() => c.closed(), "closed for a wildcard in a topic name");
    c.end();
  });

  test("CONNECT with a will, then DISCONNECT and the close in one read: the will is dropped", async () => {
    const c = await raw();
    c.send(connect("leaver", { will: { topic: "raw/will", payload: Buffer.from("gone"), qos: 1, retain: false } }), { cmd: "disconnect" } as Packet);
    c.end();
    await waitFor(() => t.agent.mqtt!.count() === 0 && c.closed(), "the session ended");
    // Published after the session ended: had the will gone out, it would be stored before this.
    const m = await raw();
    m.send(connect("marker"), { cmd: "publish", topic: "raw/will", payload: Buffer.from("marker"), qos: 1, messageId: 1, retain: false, dup: false } as Packet);
    await waitFor(() => m.packets.some((p) => p.cmd === "puback"), "marker stored");
    expect(await stored("raw.will")).toEqual(["marker"]);
    m.end();
  });

  test("CONNECT, a QoS 0 publish and the close in one read: the publish is stored, and the will of an abrupt close is published after it", async () => {
    const c = await raw();
    c.send(connect("brief", { will: { topic: "raw/brief", payload: Buffer.from("will"), qos: 0, retain: false } }), {
      cmd: "publish",
      topic: "raw/brief",
      payload: Buffer.from("hello"),
      qos: 0,
      retain: false,
      dup: false,
    } as Packet);
    c.end();
    await waitFor(async () => (await stored("raw.brief")).length === 2, "the publish and the will");
    expect(await stored("raw.brief")).toEqual(["hello", "will"]);
  });

  test("QoS 2: a publish is stored once however often it comes before PUBREL; the id is free again after it; a QoS 2 subscription gets QoS 2 (PUBREC, PUBREL, PUBCOMP)", async () => {
    const c = await raw();
    const pub = (payload: string, dup: boolean): Packet => ({ cmd: "publish", topic: "raw/q2", payload: Buffer.from(payload), qos: 2, messageId: 5, retain: false, dup }) as Packet;
    c.send(connect("q2"), pub("once", false), pub("once", true));
    await waitFor(() => c.packets.filter((p) => p.cmd === "pubrec").length === 2, "two PUBRECs");
    c.send({ cmd: "pubrel", messageId: 5 } as Packet);
    await waitFor(() => c.packets.some((p) => p.cmd === "pubcomp"), "PUBCOMP");
    c.send(pub("again", false), { cmd: "pubrel", messageId: 5 } as Packet);
    await waitFor(() => c.packets.filter((p) => p.cmd === "pubcomp").length === 2, "the second PUBCOMP");
    expect(await stored("raw.q2")).toEqual(["once", "again"]);
    c.send({ cmd: "subscribe", messageId: 9, subscriptions: [{ topic: "raw/q2", qos: 2 }] } as Packet);
    await waitFor(() => c.packets.some((p) => p.cmd === "suback"), "SUBACK");
    expect((c.packets.find((p) => p.cmd === "suback") as { granted: number[] }).granted).toEqual([2]);
    // Delivered at QoS 2: PUBLISH, PUBREC from the client, PUBREL from keyop, PUBCOMP.
    c.send({ cmd: "publish", topic: "raw/q2", payload: Buffer.from("third"), qos: 2, messageId: 6, retain: false, dup: false } as Packet);
    const out = (await waitFor(() => c.packets.find((p) => p.cmd === "publish"), "the message at QoS 2")) as Packet & { qos: number; messageId: number; payload: Buffer };
    expect([out.qos, out.payload.toString()]).toEqual([2, "third"]);
    c.send({ cmd: "pubrec", messageId: out.messageId } as Packet);
    await waitFor(() => c.packets.some((p) => p.cmd === "pubrel" && (p as { messageId: number }).messageId === out.messageId), "PUBREL");
    c.send({ cmd: "pubcomp", messageId: out.messageId } as Packet);
    c.end();
  });

  test("MQTT 5 limits of the client: no more unacknowledged than its Receive Maximum, nothing larger than its Maximum Packet Size", async () => {
    const got: { id: number; payload: string }[] = [];
    const parser = mqtt.parser({ protocolVersion: 5 });
    let subacked = false;
    parser.on("packet", (p) => {
      if (p.cmd === "publish") got.push({ id: p.messageId!, payload: p.payload.toString() });
      if (p.cmd === "suback") subacked = true;
    });
    const sock = await Bun.connect({ hostname: "127.0.0.1", port, socket: { data: (_s, d) => void parser.parse(Buffer.from(d)) } });
    const send = (p: Packet) => sock.write(mqtt.generate(p, { protocolVersion: 5 }));
    send({ ...connect("limits"), protocolVersion: 5, properties: { receiveMaximum: 2, maximumPacketSize: 200 } } as Packet);
    send({ cmd: "subscribe", messageId: 1, subscriptions: [{ topic: "raw/limits", qos: 1 }] } as Packet);
    await waitFor(() => subacked, "SUBACK");
    for (const m of ["m0", "m1", "x".repeat(500), "m2", "m3"]) await t.call("POST", "/v1/channels/raw.limits/messages", JSON.stringify({ type: "t", payload: m }));
    await waitFor(() => got.length === 2, "two messages");
    expect(got.map((g) => g.payload)).toEqual(["m0", "m1"]);
    // Each acknowledgement lets one more through; the one larger than 200 bytes is passed over.
    send({ cmd: "puback", messageId: got[0]!.id } as Packet);
    await waitFor(() => got.length === 3, "a third");
    send({ cmd: "puback", messageId: got[1]!.id } as Packet);
    await waitFor(() => got.length === 4, "a fourth");
    expect(got.map((g) => g.payload)).toEqual(["m0", "m1", "m2", "m3"]);
    sock.end();
  });

  test("MQTT 5 with an empty client id is told the id keyop assigned", async () => {
    const c = mqttjs.connect(`mqtt://127.0.0.1:${port}`, { reconnectPeriod: 0, clientId: "", protocolVersion: 5, clean: true });
    const connack = await new Promise<mqttjs.IConnackPacket>((r) => c.once("connect", r));
    expect(String(connack.properties?.assignedClientIdentifier)).toMatch(/^anon-[0-9a-f-]{36}$/);
    await c.endAsync();
  });

  test("keep-alive: a client silent for 1.5 times its interval is cut off and its will published; one that pings stays", async () => {
    const silent = await raw();
    const pinger = await raw();
    const t0 = Date.now();
    silent.send(connect("silent", { keepalive: 1, will: { topic: "raw/keepalive", payload: Buffer.from("silent gone"), qos: 1, retain: false } }));
    pinger.send(connect("pinger", { keepalive: 1 }));
    const ping = setInterval(() => pinger.send({ cmd: "pingreq" } as Packet), 400);
    try {
      await waitFor(() => silent.closed(), "the silent client cut off", 5000, 20);
      expect(Date.now() - t0).toBeGreaterThanOrEqual(1400);
      await waitFor(async () => (await stored("raw.keepalive")).length === 1, "its will");
      expect(await stored("raw.keepalive")).toEqual(["silent gone"]);
      expect(pinger.closed()).toBe(false);
      expect(pinger.packets.filter((p) => p.cmd === "pingresp").length).toBeGreaterThanOrEqual(2);
    } finally {
      clearInterval(ping);
      pinger.end();
    }
  });

  test("packets read in the same turn as the close are still handled: stored, and a DISCONNECT among them drops the will", async () => {
    // The socket's data and close callbacks can come in one turn, before the session's
    // packet pump runs; driven directly, with the agent's listener as the session's host.
    const wire = { write: () => true, writeNow: () => true, writeCopy: () => true, writable: () => Promise.resolve(), behind: () => false, end() {} };
    const bytes = (...ps: Packet[]) => Buffer.concat(ps.map((p) => mqtt.generate(p)));
    const pub = (payload: string): Packet => ({ cmd: "publish", topic: "raw/turn", payload: Buffer.from(payload), qos: 1, messageId: 7, retain: false, dup: false }) as Packet;
    const will = { topic: "raw/turn", payload: Buffer.from("will"), qos: 0 as const, retain: false };
    const a = new MqttSession(t.agent.mqtt!, wire);
    a.data(bytes(connect("turn-a", { will }), pub("first"), { cmd: "disconnect" } as Packet));
    a.socketClosed();
    const b = new MqttSession(t.agent.mqtt!, wire);
    b.data(bytes(connect("turn-b", { will }), pub("second")));
    b.socketClosed(); // no DISCONNECT: the will goes out after the publish
    await waitFor(async () => (await stored("raw.turn")).length >= 3, "three messages");
    expect(await stored("raw.turn")).toEqual(["first", "second", "will"]);
  });

  test("a QoS 1 publish alone in its read is stored and acknowledged before its read's callback returns; publishes read together wait for one shared write and are acknowledged in order", async () => {
    const writes: Uint8Array[] = [];
    const wire = {
      write: (b: Uint8Array) => (writes.push(b), true),
      writeNow: (b: Uint8Array) => (writes.push(b), true),
      writeCopy: (b: Uint8Array) => (writes.push(b.slice()), true),
      writable: () => Promise.resolve(),
      behind: () => false,
      end() {},
    };
    const bytes = (...ps: Packet[]) => Buffer.concat(ps.map((p) => mqtt.generate(p)));
    const pub = (id: number): Packet => ({ cmd: "publish", topic: "raw/alone", payload: Buffer.from(`m${id}`), qos: 1, messageId: id, retain: false, dup: false }) as Packet;
    const acks = () => writes.filter((w) => w[0] === 0x40).map((w) => (w[2]! << 8) | w[3]!);
    const next = () => t.agent.messenger.stats().channels.find((c) => c.channel === "raw.alone")?.nextSeq ?? 1;
    const s = new MqttSession(t.agent.mqtt!, wire);
    s.data(bytes(connect("alone")));
    await waitFor(() => writes.some((w) => w[0] === 0x20), "CONNACK");
    // The first publish creates the channel's log, which takes a while: acknowledged later.
    s.data(bytes(pub(1)));
    await waitFor(() => acks().length === 1, "the first PUBACK");
    // A new segment's first fill of zeros runs ahead for a moment, and a write must wait for it;
    // once it is done, a lone publish is written and acknowledged within its own callback.
    let id = 1;
    let atOnce = false;
    const deadline = Date.now() + 10_000;
    while (!atOnce && Date.now() < deadline) {
      await new Promise((r) => setImmediate(r));
      const seq = next();
      s.data(bytes(pub(++id)));
      atOnce = acks().length === id;
      if (atOnce) expect(next()).toBe(seq + 1);
      else await waitFor(() => acks().length === id, `PUBACK ${id}`);
    }
    expect(atOnce).toBe(true);
    // On an agent that forwards, the PUBACK waits for the turn's microtasks, in which a link's
    // reader forwards the message: not in the call, and not a turn later either.
    t.agent.mqtt!.forwards = true;
    try {
      let soon = false;
      const until = Date.now() + 10_000;
      while (!soon && Date.now() < until) {
        await new Promise((r) => setImmediate(r));
        s.data(bytes(pub(++id)));
        expect(acks().length).toBe(id - 1);
        await Promise.resolve();
        soon = acks().length === id;
        if (!soon) await waitFor(() => acks().length === id, `PUBACK ${id}`);
      }
      expect(soon).toBe(true);
    } finally {
      t.agent.mqtt!.forwards = false;
    }
    // Read together: they wait for one shared write.
    await new Promise((r) => setImmediate(r));
    s.data(bytes(pub(id + 1), pub(id + 2), pub(id + 3)));
    expect(acks().length).toBe(id);
    id += 3;
    await waitFor(() => acks().length === id, "three PUBACKs");
    const all = Array.from({ length: id }, (_, i) => i + 1);
    expect(acks()).toEqual(all);
    expect(await stored("raw.alone")).toEqual(all.map((i) => `m${i}`));
    s.socketClosed();
  });
});

describe("MQTT session expiry", () => {
  let x: TestAgent;
  let xport: number;
  beforeAll(async () => {
    x = await startTestAgent({ mqtt: { listen: "127.0.0.1:0", session_expiry: "2s" } });
    xport = x.agent.mqtt!.port!;
  });
  afterAll(() => x.stop());

  const kept = (id: string) =>
    x.agent.messenger
      .subscribers()
      .filter((s) => s.name === `mqtt.${id}`)
      .map((s) => s.pattern);
  const connect = (opts: mqttjs.IClientOptions) => mqttjs.connectAsync(`mqtt://127.0.0.1:${xport}`, { reconnectPeriod: 0, ...opts });
  const connackOf = (c: mqttjs.MqttClient) => new Promise<mqttjs.IConnackPacket>((r) => c.once("connect", r));

  test("MQTT 5, clean start 0 with no session expiry: the session ends with the connection", async () => {
    const c = await connect({ clientId: "v5-zero", clean: false, protocolVersion: 5 });
    await c.subscribeAsync("exp/zero", { qos: 1 });
    expect(kept("v5-zero")).toEqual([]); // live only: nothing would outlive the connection
    await c.endAsync();
    await x.call("POST", "/v1/channels/exp.zero/messages", JSON.stringify({ type: "t", payload: "while away" }));
    const again = mqttjs.connect(`mqtt://127.0.0.1:${xport}`, { reconnectPeriod: 0, clientId: "v5-zero", clean: false, protocolVersion: 5, properties: { sessionExpiryInterval: 60 } });
    const connack = await connackOf(again);
    expect(connack.sessionPresent).toBe(false);
    // More than mqtt.session_expiry asked for: CONNACK says what it got.
    expect(connack.properties?.sessionExpiryInterval).toBe(2);
    await again.endAsync();
  });

  test("a persistent session is kept for its expiry after the connection goes, then its durable subscriber goes too", async () => {
    for (const [id, opts] of [
      ["v4-kept", { clean: false, protocolVersion: 4 }],
      ["v5-kept", { clean: false, protocolVersion: 5, properties: { sessionExpiryInterval: 1 } }],
    ] as const) {
      const c = await connect({ clientId: id, ...opts });
      await c.subscribeAsync("exp/kept", { qos: 1 });
      expect(kept(id)).toEqual(["exp.kept"]);
      await c.endAsync();
      // Within the expiry: still there, and a reconnect finds it.
      const back = mqttjs.connect(`mqtt://127.0.0.1:${xport}`, { reconnectPeriod: 0, clientId: id, ...opts });
      expect((await connackOf(back)).sessionPresent).toBe(true);
      await back.endAsync();
      const t0 = Date.now();
      await waitFor(() => kept(id).length === 0, `${id}'s durable subscriber removed on expiry`, 10_000, 50);
      const waited = Date.now() - t0;
      expect(waited).toBeGreaterThanOrEqual(opts.protocolVersion === 5 ? 900 : 1900);
      const late = mqttjs.connect(`mqtt://127.0.0.1:${xport}`, { reconnectPeriod: 0, clientId: id, ...opts });
      expect((await connackOf(late)).sessionPresent).toBe(false);
      await late.endAsync();
    }
  });

  test("client ids real devices use (a MAC address, a path, spaces, non-ASCII, very long) keep persistent sessions, none shared", async () => {
    const ids = ["aa:bb:cc:dd:ee:ff", "device/42", "clean retained", "capteur-é-温度", "#+/", "x".repeat(300), `${"x".repeat(299)}y`];
    for (const id of ids) {
      const c = await connect({ clientId: id, clean: false, protocolVersion: 4 });
      await c.subscribeAsync(`ids/${ids.indexOf(id)}`, { qos: 1 });
      await c.endAsync();
    }
    for (const [i, id] of ids.entries()) {
      await x.call("POST", `/v1/channels/ids.${i}/messages`, JSON.stringify({ type: "t", payload: `for ${i}` }));
      const back = mqttjs.connect(`mqtt://127.0.0.1:${xport}`, { reconnectPeriod: 0, clientId: id, clean: false, protocolVersion: 4 });
      const got = new Promise<string>((r) => back.once("message", (_t, m) => r(m.toString())));
      expect((await connackOf(back)).sessionPresent).toBe(true);
      // Its own session only: the message of its own subscription, kept while it was away.
      expect(await got).toBe(`for ${i}`);
      await back.endAsync();
    }
    const names = ids.map(sessionName);
    expect(new Set(names).size).toBe(ids.length);
  });

  test("will topics are checked like any topic: an empty level is fine; a bad one is refused as a bad topic, not a bad client id", async () => {
    const ok = await connect({ clientId: "will-ok", clean: true, protocolVersion: 5, will: { topic: "client_test5//TopicA", payload: Buffer.from("w"), qos: 1, retain: false } });
    await ok.endAsync();
    const v5 = mqttjs.connect(`mqtt://127.0.0.1:${xport}`, {
      reconnectPeriod: 0,
      clientId: "will-bad5",
      protocolVersion: 5,
      will: { topic: "$SYS/x", payload: Buffer.from("w"), qos: 1, retain: false },
    });
    const code5 = await new Promise<number | undefined>((r) => v5.once("error", (e) => r((e as { code?: number }).code)));
    expect(code5).toBe(0x90);
    v5.end(true);
    const v4 = mqttjs.connect(`mqtt://127.0.0.1:${xport}`, {
      reconnectPeriod: 0,
      clientId: "will-bad4",
      protocolVersion: 4,
      will: { topic: "$SYS/x", payload: Buffer.from("w"), qos: 1, retain: false },
    });
    let connack: number | undefined;
    v4.on("error", (e) => (connack = (e as { code?: number }).code));
    await new Promise<void>((r) => v4.once("close", () => r()));
    // Closed without CONNACK 2 ("identifier rejected"): 3.1.1 has no code for a bad topic.
    expect(connack).toBeUndefined();
    v4.end(true);
  });

  test("MQTT 5 retain handling: 0 sends the retained message, 1 only for a new subscription, 2 never", async () => {
    const pub = await connect({ clientId: "rh-pub", clean: true });
    await pub.publishAsync("rh/t", "kept", { qos: 1, retain: true });
    const got: Record<string, number> = {};
    const sub = await connect({ clientId: "rh-sub", clean: true, protocolVersion: 5 });
    sub.on("message", (t, _m, packet) => {
      if (packet.retain) got[t] = (got[t] ?? 0) + 1;
    });
    await sub.subscribeAsync("rh/t", { qos: 1, rh: 2 });
    await sub.subscribeAsync("rh/+", { qos: 1, rh: 1 });
    await waitFor(() => got["rh/t"] === 1, "the retained message for the new rh/+", 5000, 20);
    await sub.subscribeAsync("rh/+", { qos: 1, rh: 1 }); // exists already: nothing again
    await sub.subscribeAsync("rh/#", { qos: 1, rh: 0 }); // new, 0: sent (and for its parent, rh, nothing is retained)
    await waitFor(() => got["rh/t"] === 2, "the retained message for rh/#", 5000, 20);
    await sub.subscribeAsync("rh/#", { qos: 1, rh: 0 }); // 0 sends it every time
    await waitFor(() => got["rh/t"] === 3, "again for rh/# with 0", 5000, 20);
    // A marker through a fresh subscription, then no more than those three.
    await sub.subscribeAsync("rh-marker", { qos: 1 });
    let marked = false;
    sub.on("message", (t) => {
      if (t === "rh-marker") marked = true;
    });
    await pub.publishAsync("rh-marker", "m", { qos: 1 });
    await waitFor(() => marked, "the marker", 5000, 20);
    expect(got["rh/t"]).toBe(3);
    await pub.publishAsync("rh/t", "", { qos: 1, retain: true });
    for (const c of [pub, sub]) await c.endAsync();
  });

  test("sport/# gets sport itself too, live and retained; unsubscribing it stops both", async () => {
    const pub = await connect({ clientId: "parent-pub", clean: true });
    await pub.publishAsync("sport", "retained parent", { qos: 1, retain: true });
    const got: string[] = [];
    const sub = await connect({ clientId: "parent-sub", clean: true });
    sub.on("message", (t, m) => got.push(`${t}=${m}`));
    await sub.subscribeAsync("sport/#", { qos: 1 });
    await waitFor(() => got.length >= 1, "the retained message of sport", 5000, 20);
    await pub.publishAsync("sport", "live parent", { qos: 1 });
    await pub.publishAsync("sport/tennis", "child", { qos: 1 });
    await waitFor(() => got.length >= 3, "parent and child", 5000, 20);
    expect(got).toEqual(["sport=retained parent", "sport=live parent", "sport/tennis=child"]);
    await sub.unsubscribeAsync("sport/#");
    await pub.publishAsync("sport", "after", { qos: 1 });
    await pub.publishAsync("sport/x", "after", { qos: 1 });
    const marker = await connect({ clientId: "parent-marker", clean: true });
    await sub.subscribeAsync("marker", { qos: 1 });
    await marker.publishAsync("marker", "m", { qos: 1 });
    await waitFor(() => got.includes("marker=m"), "the marker after the unsubscribe", 5000, 20);
    expect(got.filter((g) => g.endsWith("=after"))).toEqual([]);
    await pub.publishAsync("sport", "", { qos: 1, retain: true }); // clears the retained message for the tests after
    for (const c of [pub, sub, marker]) await c.endAsync();
  });

  test("topics with empty levels, a leading /, dots, spaces and $ work end to end; # does not get $ topics, $foo/# does", async () => {
    const all: string[] = [];
    const dollar: string[] = [];
    const wild = await connect({ clientId: "topics-all", clean: true });
    wild.on("message", (t) => all.push(t));
    await wild.subscribeAsync("#", { qos: 1 });
    const dol = await connect({ clientId: "topics-dollar", clean: true });
    dol.on("message", (t) => dollar.push(t));
    await dol.subscribeAsync("$foo/#", { qos: 1 });
    const pub = await connect({ clientId: "topics-pub", clean: true, protocolVersion: 5 });
    const topics = ["/TopicA", "a//b", "client_test5//TopicA", "a.b/c d", "capteur/é", "a/b/", "$foo/bar"];
    for (const t of topics) await pub.publishAsync(t, "x", { qos: 1 });
    await waitFor(() => all.length >= topics.length - 1 && dollar.length >= 1, "every topic delivered", 10_000, 20);
    expect(all.sort()).toEqual(topics.filter((t) => !t.startsWith("$")).sort());
    expect(dollar).toEqual(["$foo/bar"]);
    for (const c of [wild, dol, pub]) await c.endAsync();
  });

  test("MQTT 5 clean start 1 drops what an earlier session of the id kept before the new one is served", async () => {
    const c = await connect({ clientId: "v5-restart", clean: false, protocolVersion: 5, properties: { sessionExpiryInterval: 60 } });
    await c.subscribeAsync("exp/restart", { qos: 1 });
    await c.endAsync();
    expect(kept("v5-restart")).toEqual(["exp.restart"]);
    const fresh = mqttjs.connect(`mqtt://127.0.0.1:${xport}`, { reconnectPeriod: 0, clientId: "v5-restart", clean: true, protocolVersion: 5, properties: { sessionExpiryInterval: 60 } });
    expect((await connackOf(fresh)).sessionPresent).toBe(false);
    await fresh.subscribeAsync("exp/other", { qos: 1 });
    expect(kept("v5-restart")).toEqual(["exp.other"]);
    await fresh.endAsync();
  });
});

describe("MQTT on a Unix socket, and mqtt.max_clients", () => {
  let u: TestAgent;
  let path: string;
  beforeAll(async () => {
    const dir = tmpDir();
    path = join(dir, "mqtt.sock");
    u = await startTestAgent({ mqtt: { socket: path, max_clients: 2 } }, undefined, dir);
  });
  afterAll(() => u.stop());

  test("mosquitto_pub --unix stores a QoS 1 message; no TCP port is opened", async () => {
    expect(u.agent.mqtt!.port).toBeUndefined();
    const p = Bun.spawn(["mosquitto_pub", "--unix", path, "-t", "unix/hello", "-m", "over a socket file", "-q", "1"], { stderr: "pipe" });
    expect(await p.exited).toBe(0);
    const r = (await (await u.call("GET", "/v1/channels/unix.hello/messages?subscriber=u&from=earliest")).json()) as { messages: { payload: string; type: string }[] };
    expect(r.messages.map((m) => [m.type, m.payload])).toEqual([["mqtt", "over a socket file"]]);
  });

  test("a client past mqtt.max_clients gets CONNACK 'server unavailable'; room again once one goes", async () => {
    const open = async (id: string) => {
      const packets: Packet[] = [];
      const parser = mqtt.parser({ protocolVersion: 4 });
      parser.on("packet", (p) => packets.push(p));
      const sock = await Bun.connect({ unix: path, socket: { data: (_s, d) => void parser.parse(Buffer.from(d)) } });
      sock.write(mqtt.generate(connect(id)));
      await waitFor(() => packets.find((p) => p.cmd === "connack"), `${id}'s CONNACK`);
      return { code: (packets.find((p) => p.cmd === "connack") as { returnCode: number }).returnCode, sock };
    };
    const a = await open("one");
    const b = await open("two");
    const c = await open("three");
    expect([a.code, b.code, c.code]).toEqual([0, 0, 3]);
    a.sock.end();
    await waitFor(() => u.agent.mqtt!.count() === 1, "one client gone");
    const d = await open("four");
    expect(d.code).toBe(0);
    for (const x of [b, c, d]) x.sock.end();
  });
});
