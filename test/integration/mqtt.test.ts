import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import mqtt, { type MqttClient } from "mqtt";
import packets from "mqtt-packet";
import { freePort, tmpDir, waitFor } from "../helpers.ts";
import { cli, fleet, runAgent, type AgentProc } from "./agent-process.ts";

let dir: string;
let port: number;
let agent: AgentProc;
let cfgPath: string;
const clients: MqttClient[] = [];

const api = (method: string, path: string, body?: string) =>
  fetch(`http://k${path}`, { method, body, headers: { "content-type": "application/json" }, unix: agent.socket } as RequestInit).then((r) => r.json() as Promise<any>);

/**
 * An mqtt.js client, connected. `onMessage` is attached before the CONNECT
 * goes out: a resumed session's messages may come in the same read as the
 * CONNACK, before any handler attached after `connectAsync` resolves.
 */
async function client(opts: mqtt.IClientOptions = {}, onMessage?: (topic: string, payload: Buffer) => void): Promise<MqttClient> {
  const c = mqtt.connect(`mqtt://127.0.0.1:${port}`, { reconnectPeriod: 0, ...opts });
  clients.push(c);
  if (onMessage) c.on("message", onMessage);
  await new Promise<void>((resolve, reject) => {
    c.once("connect", () => resolve());
    c.once("error", reject);
  });
  return c;
}

/** Runs a mosquitto command-line client; resolves with its exit code and output. */
async function mosq(args: string[]): Promise<{ code: number; out: string; err: string }> {
  const p = Bun.spawn(args, { stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { code, out, err };
}

beforeAll(async () => {
  dir = tmpDir();
  port = freePort();
  cfgPath = join(dir, "k.yaml");
  writeFileSync(cfgPath, `mqtt:\n  listen: 127.0.0.1:${port}\n  max_packet_bytes: 64KiB\n`);
  agent = await runAgent(join(dir, "a"), ["--config", cfgPath]);
});

afterAll(async () => {
  for (const c of clients) c.end(true);
  agent.child.proc.kill("SIGTERM");
  await agent.child.proc.exited;
});

describe("MQTT listener", () => {
  test("mosquitto_pub at QoS 1 is stored (type mqtt, JSON text readable over HTTP); mosquitto_sub gets an HTTP publish unchanged", async () => {
    const pub = await mosq(["mosquitto_pub", "-p", String(port), "-t", "sensors/kitchen/temp", "-m", '{"celsius":21.5}', "-q", "1", "-V", "mqttv311"]);
    expect(pub.code).toBe(0);
    const stored = await api("GET", "/v1/channels/sensors.kitchen.temp/messages?subscriber=h&from=earliest");
    expect(stored.messages[0]).toMatchObject({ type: "mqtt", payload: '{"celsius":21.5}' });
    const sub = Bun.spawn(["mosquitto_sub", "-p", String(port), "-t", "sensors/+/temp", "-q", "1", "-C", "1", "-V", "mqttv5", "-W", "10"], { stdout: "pipe", stderr: "pipe" });
    // Publish until the subscription is in place and the message comes through.
    let out = "";
    const reading = new Response(sub.stdout).text().then((t) => (out = t));
    await waitFor(
      async () => {
        await api("POST", "/v1/channels/sensors.hall.temp/messages", JSON.stringify({ type: "reading", payload: { celsius: 19 } }));
        return out !== "" || (await Promise.race([reading.then(() => true), Bun.sleep(100).then(() => false)]));
      },
      "mosquitto_sub got a message",
      10_000,
      0,
    );
    expect(await sub.exited).toBe(0);
    expect(out.trim()).toBe('{"celsius":19}');
  });

  test("mqtt.js: + and # wildcards, QoS 0 and 1, bytes that are not UTF-8 arrive unchanged", async () => {
    const sub = await client({ clientId: "wild" });
    const got: { topic: string; payload: Buffer; qos: number }[] = [];
    sub.on("message", (topic, payload, packet) => got.push({ topic, payload, qos: packet.qos }));
    await sub.subscribeAsync({ "a/+/c": { qos: 1 }, "z/#": { qos: 0 } });
    const pub = await client({ clientId: "pubber", protocolVersion: 5 });
    const raw = Buffer.from([0xff, 0x00, 0xfe, 0x80]);
    await pub.publishAsync("a/b/c", raw, { qos: 1 });
    await pub.publishAsync("a/b/x", "not matched", { qos: 1 });
    await pub.publishAsync("z/y/x/w", "deep", { qos: 0 });
    await waitFor(() => got.length >= 2, "two matching messages");
    const byTopic = Object.fromEntries(got.map((g) => [g.topic, g]));
    expect([...byTopic["a/b/c"]!.payload]).toEqual([...raw]);
    expect(byTopic["a/b/c"]!.qos).toBe(1);
    expect(byTopic["z/y/x/w"]!.payload.toString()).toBe("deep");
    expect(got.some((g) => g.topic === "a/b/x")).toBe(false);
  });

  test("a persistent session gets what was published while it was away, across a disconnect and across a keyop restart", async () => {
    let c = await client({ clientId: "keeper", clean: false });
    await c.subscribeAsync("orders/#", { qos: 1 });
    await c.endAsync();
    for (let i = 0; i < 3; i++) await api("POST", "/v1/channels/orders.new/messages", JSON.stringify({ type: "o", payload: { i } }));
    const first: string[] = [];
    c = await client({ clientId: "keeper", clean: false }, (_t, p) => first.push(p.toString()));
    await waitFor(() => first.length >= 3, "three kept messages after reconnecting");
    expect(first).toEqual(['{"i":0}', '{"i":1}', '{"i":2}']);
    await c.endAsync();
    // Published while the client is away, then keyop restarts: still there for it.
    for (let i = 3; i < 5; i++) await api("POST", "/v1/channels/orders.new/messages", JSON.stringify({ type: "o", payload: { i } }));
    agent.child.proc.kill("SIGTERM");
    await agent.child.proc.exited;
    agent = await runAgent(join(dir, "a"), ["--config", cfgPath]);
    const second: string[] = [];
    c = await client({ clientId: "keeper", clean: false }, (_t, p) => second.push(p.toString()));
    await waitFor(() => second.length >= 2, "two kept messages after a keyop restart");
    expect(second).toEqual(['{"i":3}', '{"i":4}']);
  }, 60_000);

  test("retained: the last one per channel is sent on subscribe with the retain flag at the lower of its QoS and the subscription's, kept across a restart, cleared by an empty one", async () => {
    expect((await mosq(["mosquitto_pub", "-p", String(port), "-t", "home/door", "-m", "closed", "-q", "1", "-r"])).code).toBe(0);
    expect((await mosq(["mosquitto_pub", "-p", String(port), "-t", "home/door", "-m", "open", "-q", "1", "-r"])).code).toBe(0);
    const first = async (qos: 0 | 1 = 1) => {
      let resolve!: (m: { payload: string; retain: boolean; qos: number }) => void;
      const got = new Promise<{ payload: string; retain: boolean; qos: number }>((r) => (resolve = r));
      const c = await client({ clientId: `late-${Math.random().toString(36).slice(2)}` }, undefined);
      c.on("message", (_t, p, packet) => resolve({ payload: p.toString(), retain: packet.retain, qos: packet.qos }));
      await c.subscribeAsync("home/#", { qos });
      // A marker after the subscription: when nothing is retained, the marker comes first.
      await api("POST", "/v1/channels/home.marker/messages", JSON.stringify({ type: "m", payload: "marker" }));
      const m = await got;
      await c.endAsync();
      return m;
    };
    expect(await first()).toEqual({ payload: "open", retain: true, qos: 1 });
    expect(await first(0)).toEqual({ payload: "open", retain: true, qos: 0 });
    agent.child.proc.kill("SIGTERM");
    await agent.child.proc.exited;
    agent = await runAgent(join(dir, "a"), ["--config", cfgPath]);
    expect(await first()).toEqual({ payload: "open", retain: true, qos: 1 });
    // Retained again at QoS 0: a QoS 1 subscription gets it at QoS 0.
    expect((await mosq(["mosquitto_pub", "-p", String(port), "-t", "home/door", "-m", "ajar", "-q", "0", "-r"])).code).toBe(0);
    await waitFor(async () => (await first()).payload === "ajar", "the QoS 0 retained message replaced the QoS 1 one");
    expect(await first()).toEqual({ payload: "ajar", retain: true, qos: 0 });
    expect((await mosq(["mosquitto_pub", "-p", String(port), "-t", "home/door", "-n", "-q", "1", "-r"])).code).toBe(0);
    expect(await first()).toEqual({ payload: "marker", retain: false, qos: 1 });
  }, 60_000);

  test("MQTT 5 with mosquitto_sub and mosquitto_pub: QoS 2 end to end, properties as published, a shared subscription's messages once each; status shows the listener", async () => {
    const fmt = ["-F", "%t|%q|%P|%R|%C|%E"];
    const sub = Bun.spawn(["mosquitto_sub", "-V", "5", "-p", String(port), "-q", "2", "-t", "v5/props", "-C", "1", "-W", "15", ...fmt], { stdout: "pipe", stderr: "pipe" });
    const shared = [0, 1].map(() => Bun.spawn(["mosquitto_sub", "-V", "5", "-p", String(port), "-q", "1", "-t", "$share/workers/v5/jobs", "-W", "8", "-F", "%p"], { stdout: "pipe", stderr: "pipe" }));
    // Until both shared members and the subscriber are connected (status counts clients).
    await waitFor(async () => (await api("GET", "/v1/status")).mqtt.clients >= 3, "three subscribers connected", 10_000, 20);
    await waitFor(async () => (await api("GET", "/v1/status")).mqtt.shared_groups >= 1, "the shared group", 10_000, 20);
    const status = (await api("GET", "/v1/status")).mqtt;
    expect(status.listeners.tcp).toBe(`127.0.0.1:${port}`);
    const pub = ["mosquitto_pub", "-V", "5", "-p", String(port)];
    const props = [
      "-D",
      "publish",
      "user-property",
      "site",
      "north",
      "-D",
      "publish",
      "response-topic",
      "v5/reply",
      "-D",
      "publish",
      "content-type",
      "text/x",
      "-D",
      "publish",
      "message-expiry-interval",
      "300",
    ];
    // Published until the subscriber's subscription is in place (it exits after one message).
    let out = "";
    const reading = new Response(sub.stdout).text().then((t) => (out = t));
    await waitFor(
      async () => {
        expect((await mosq([...pub, "-q", "2", "-t", "v5/props", "-m", "hello", ...props])).code).toBe(0);
        return out !== "" || (await Promise.race([reading.then(() => true), Bun.sleep(200).then(() => false)]));
      },
      "mosquitto_sub got the message",
      15_000,
      0,
    );
    const [topic, qos, user, reply, ctype, expiry] = out.trim().split("|");
    expect([topic, qos, user, reply, ctype]).toEqual(["v5/props", "2", "site:north", "v5/reply", "text/x"]);
    expect(Number(expiry)).toBeGreaterThan(290);
    for (let i = 0; i < 10; i++) expect((await mosq([...pub, "-q", "1", "-t", "v5/jobs", "-m", `job-${i}`])).code).toBe(0);
    const outs = await Promise.all(shared.map((p) => new Response(p.stdout).text()));
    const got = outs.flatMap((o) => o.split("\n").filter(Boolean));
    expect(got.sort()).toEqual(Array.from({ length: 10 }, (_, i) => `job-${i}`).sort());
  }, 40_000);

  test("a retained will is kept as the channel's retained message", async () => {
    const dying = await client({ clientId: "dev7", will: { topic: "status/dev7", payload: Buffer.from("offline"), qos: 1, retain: true } });
    (dying as unknown as { stream: { destroy(): void } }).stream.destroy();
    // Stored as retained (a file of its own), and in the log.
    await waitFor(() => existsSync(join(agent.dataDir, "mqtt-retained", "status.dev7.rmsg")), "the retained will on disk");
    expect((await api("GET", "/v1/channels/status.dev7/messages?subscriber=w&from=earliest")).messages.map((m: any) => m.payload)).toEqual(["offline"]);
    let resolve!: (m: { payload: string; retain: boolean; qos: number }) => void;
    const got = new Promise<{ payload: string; retain: boolean; qos: number }>((r) => (resolve = r));
    const late = await client({ clientId: "later" }, undefined);
    late.on("message", (_t, p, packet) => resolve({ payload: p.toString(), retain: packet.retain, qos: packet.qos }));
    await late.subscribeAsync("status/dev7", { qos: 1 });
    expect(await got).toEqual({ payload: "offline", retain: true, qos: 1 });
  });

  test("a will is published when a client goes away without DISCONNECT", async () => {
    const watcher = await client({ clientId: "watcher" });
    const wills: string[] = [];
    watcher.on("message", (t, p) => t === "status/dev9" && wills.push(p.toString()));
    await watcher.subscribeAsync("status/dev9", { qos: 1 });
    const dying = await client({ clientId: "dev9", will: { topic: "status/dev9", payload: Buffer.from("offline"), qos: 1, retain: false } });
    (dying as unknown as { stream: { destroy(): void } }).stream.destroy(); // no DISCONNECT: the socket just goes
    await waitFor(() => wills.length === 1, "the will");
    expect(wills).toEqual(["offline"]);
  });

  test("bad topics, an oversized packet and garbage: refused or cut off, the agent carries on", async () => {
    // MQTT 5: the ack says why; $SYS topics are the broker's.
    const v5 = await client({ clientId: "bad5", protocolVersion: 5 });
    const err = await v5.publishAsync("$SYS/x", "x", { qos: 1 }).catch((e) => e);
    expect(err?.code ?? err?.reasonCode).toBe(0x90);
    // A filter longer than any keyop pattern can be is refused in the SUBACK.
    const refused = await v5.subscribeAsync(`${"x/".repeat(150)}#`, { qos: 1 }).catch((e) => e);
    expect(refused.packet.granted).toEqual([0x8f]);
    // MQTT 3.1.1 has no reason codes for a publish: the connection is closed.
    const v4 = await client({ clientId: "bad4" });
    const closed = new Promise<void>((r) => v4.on("close", () => r()));
    v4.publish("$SYS/hidden", "x", { qos: 1 });
    await closed;
    // More than max_packet_bytes: cut off.
    const big = await client({ clientId: "big" });
    const bigClosed = new Promise<void>((r) => big.on("close", () => r()));
    big.publish("big/one", Buffer.alloc(100 * 1024), { qos: 1 });
    await bigClosed;
    expect((await api("GET", "/v1/channels")).channels.some((c: any) => c.channel === "big.one")).toBe(false);
    // Garbage instead of MQTT.
    const junk = await new Promise<boolean>((resolve) => {
      Bun.connect({
        hostname: "127.0.0.1",
        port,
        socket: { open: (s) => void s.write("GET / HTTP/1.1\r\n\r\n\xff\xff\xff"), data() {}, close: () => resolve(true), error: () => resolve(true) },
      }).catch(() => resolve(false));
    });
    expect(junk).toBe(true);
    // Still serving.
    expect(agent.child.proc.exitCode).toBe(null);
    const ok = await client({ clientId: "after" });
    await ok.publishAsync("still/here", "yes", { qos: 1 });
    expect((await api("GET", "/v1/channels/still.here/messages?subscriber=h&from=earliest")).messages[0].payload).toBe("yes");
  });
});

/**
 * A raw MQTT 3.1.1 client that never acknowledges anything: what it is sent, with the DUP flags.
 * With `filter` null it only connects (a kept session resumes its subscriptions by itself).
 */
async function rawNoAck(clientId: string, filter: string | null): Promise<{ got: { payload: string; dup: boolean }[]; subscribe: (filter: string) => Promise<void>; close: () => void }> {
  const got: { payload: string; dup: boolean }[] = [];
  const parser = packets.parser({ protocolVersion: 4 });
  let connacked = false;
  let subacks = 0;
  parser.on("packet", (p) => {
    if (p.cmd === "publish") got.push({ payload: p.payload.toString(), dup: p.dup });
    if (p.cmd === "connack") connacked = true;
    if (p.cmd === "suback") subacks++;
  });
  const sock = await Bun.connect({ hostname: "127.0.0.1", port, socket: { data: (_s, d) => void parser.parse(Buffer.from(d)) } });
  sock.write(packets.generate({ cmd: "connect", protocolId: "MQTT", protocolVersion: 4, clean: false, clientId, keepalive: 0 } as packets.Packet));
  let nextId = 1;
  const subscribe = async (f: string) => {
    const want = subacks + 1;
    sock.write(packets.generate({ cmd: "subscribe", messageId: nextId++, subscriptions: [{ topic: f, qos: 1 }] } as packets.Packet));
    await waitFor(() => subacks >= want, "SUBACK");
  };
  if (filter !== null) await subscribe(filter);
  else await waitFor(() => connacked, "CONNACK");
  return { got, subscribe, close: () => sock.terminate() };
}

describe("MQTT DUP across keyop restarts", () => {
  test("unacknowledged QoS 1 messages come again with DUP after a clean restart, and after a SIGKILL; new ones without", async () => {
    const post = (n: string) => api("POST", "/v1/channels/dup.t/messages", JSON.stringify({ type: "t", payload: n }));
    let c = await rawNoAck("dupper", "dup/#");
    await post("one");
    await post("two");
    await waitFor(() => c.got.length === 2, "two messages");
    expect(c.got).toEqual([
      { payload: "one", dup: false },
      { payload: "two", dup: false },
    ]);
    c.close();
    for (const signal of ["SIGTERM", "SIGKILL"] as const) {
      agent.child.proc.kill(signal);
      await agent.child.proc.exited;
      agent = await runAgent(join(dir, "a"), ["--config", cfgPath]);
      await post(signal);
      c = await rawNoAck("dupper", "dup/#");
      await waitFor(() => c.got.length === 3 + (signal === "SIGKILL" ? 1 : 0), `all of them after ${signal}`);
      c.close();
      if (signal === "SIGTERM") {
        // A clean stop saved exactly what went out.
        expect(c.got).toEqual([
          { payload: "one", dup: true },
          { payload: "two", dup: true },
          { payload: "SIGTERM", dup: false },
        ]);
      } else {
        // After a crash all that was stored before the restart counts as maybe sent; the new one does not.
        expect(c.got).toEqual([
          { payload: "one", dup: true },
          { payload: "two", dup: true },
          { payload: "SIGTERM", dup: true },
          { payload: "SIGKILL", dup: false },
        ]);
      }
    }
  }, 60_000);
});

describe("MQTT subscribe again", () => {
  test("a kept session subscribing again to the filter it has: nothing in flight is sent twice, the flow goes on", async () => {
    const post = (n: string) => api("POST", "/v1/channels/resub.t/messages", JSON.stringify({ type: "t", payload: n }));
    let c = await rawNoAck("resubber", "resub/#");
    await post("one");
    await post("two");
    await waitFor(() => c.got.length === 2, "two messages");
    c.close();
    // Back without subscribing: the kept session resends what was not acknowledged, with DUP.
    c = await rawNoAck("resubber", null);
    await waitFor(() => c.got.length === 2, "the two again");
    expect(c.got).toEqual([
      { payload: "one", dup: true },
      { payload: "two", dup: true },
    ]);
    // The same filter again (a client that always subscribes on connect): MQTT-3.8.4-3, the flow is not
    // interrupted, so what is in flight is not sent a second time; new messages keep coming.
    await c.subscribe("resub/#");
    await post("three");
    // In order per channel: a second copy of one or two would come before three.
    await waitFor(() => c.got.some((m) => m.payload === "three"), "the third");
    expect(c.got).toEqual([
      { payload: "one", dup: true },
      { payload: "two", dup: true },
      { payload: "three", dup: false },
    ]);
    c.close();
  });
});

describe("MQTT across a hub", () => {
  test("mosquitto_pub on device A reaches an MQTT subscriber on device B through a hub, topics with empty levels and dots too", async () => {
    const d = tmpDir();
    const tls = await fleet(d, ["hub", "devA", "devB"]);
    const hubPort = freePort();
    const [mqttA, mqttB] = [freePort(), freePort()];
    const cfg = (n: string, body: string) => {
      writeFileSync(join(d, `${n}.yaml`), tls(n) + body);
      return join(d, `${n}.yaml`);
    };
    const hub = await runAgent(join(d, "hub"), [
      "--config",
      cfg(
        "hub",
        `hub:\n  listen: 127.0.0.1:${hubPort}\n  peers:\n    - name: devA\n      publish: ["plant.>"]\n      subscribe: []\n    - name: devB\n      publish: []\n      subscribe: ["plant.>"]\n`,
      ),
    ]);
    const a = await runAgent(join(d, "a"), ["--config", cfg("devA", `mqtt:\n  listen: 127.0.0.1:${mqttA}\nlinks:\n  - hub: 127.0.0.1:${hubPort}\n    publish: ["plant.>"]\n    subscribe: []\n`)]);
    const b = await runAgent(join(d, "b"), ["--config", cfg("devB", `mqtt:\n  listen: 127.0.0.1:${mqttB}\nlinks:\n  - hub: 127.0.0.1:${hubPort}\n    publish: []\n    subscribe: ["plant.>"]\n`)]);
    try {
      // A persistent session on B (so nothing is missed while the links come up), then the publish on A.
      const sub = await mqtt.connectAsync(`mqtt://127.0.0.1:${mqttB}`, { clientId: "plant-reader", clean: false, reconnectPeriod: 0 });
      const got = new Promise<{ topic: string; payload: string }>((r) => sub.on("message", (topic, p) => r({ topic, payload: p.toString() })));
      await sub.subscribeAsync("plant/#", { qos: 1 });
      expect((await mosq(["mosquitto_pub", "-p", String(mqttA), "-t", "plant/line1/pressure", "-m", '{"bar":2.5}', "-q", "1"])).code).toBe(0);
      expect(await got).toEqual({ topic: "plant/line1/pressure", payload: '{"bar":2.5}' });
      // Topics that needed escaping cross the hub and come out as they went in.
      const odd = ["plant//line 2", "plant/.hidden/é", "plant/a/"];
      const seen: string[] = [];
      sub.on("message", (topic) => seen.push(topic));
      for (const t of odd) expect((await mosq(["mosquitto_pub", "-p", String(mqttA), "-t", t, "-m", "x", "-q", "1"])).code).toBe(0);
      await waitFor(() => seen.length >= odd.length, "the escaped topics at B", 20_000, 20);
      expect(seen.sort()).toEqual([...odd].sort());
      await sub.endAsync();
      // MQTT 5 properties given on A come out on B as they were given.
      const sub5 = await mqtt.connectAsync(`mqtt://127.0.0.1:${mqttB}`, { protocolVersion: 5, clientId: "plant-reader-5", clean: true, reconnectPeriod: 0 });
      const got5 = new Promise<Record<string, unknown>>((r) => sub5.on("message", (_t, _p, packet) => r(packet.properties as Record<string, unknown>)));
      await sub5.subscribeAsync("plant/props", { qos: 1 });
      const pub5 = ["mosquitto_pub", "-V", "5", "-p", String(mqttA), "-t", "plant/props", "-m", "x", "-q", "1"];
      const props = [
        "-D",
        "publish",
        "user-property",
        "line",
        "1",
        "-D",
        "publish",
        "user-property",
        "shift",
        "night",
        "-D",
        "publish",
        "content-type",
        "text/x",
        "-D",
        "publish",
        "response-topic",
        "plant/reply",
        "-D",
        "publish",
        "correlation-data",
        "c-17",
        "-D",
        "publish",
        "message-expiry-interval",
        "600",
      ];
      expect((await mosq([...pub5, ...props])).code).toBe(0);
      const p5 = await got5;
      expect(p5).toMatchObject({ userProperties: { line: "1", shift: "night" }, contentType: "text/x", responseTopic: "plant/reply", correlationData: Buffer.from("c-17") });
      expect(p5.messageExpiryInterval as number).toBeGreaterThan(590);
      await sub5.endAsync();
    } finally {
      for (const x of [a, b, hub]) {
        x.child.proc.kill("SIGTERM");
        await x.child.proc.exited;
      }
    }
  }, 60_000);
});

describe("MQTT users", () => {
  test("a password hashed with keyop passwd lets the user in; a wrong one is refused; the user's topic rules hold", async () => {
    const d = tmpDir();
    const hash = await cli(["passwd"], { stdin: "s3cret\n" });
    expect(hash.code).toBe(0);
    expect(hash.out.startsWith("$argon2id$")).toBe(true);
    const p = freePort();
    writeFileSync(
      join(d, "k.yaml"),
      `mqtt:\n  listen: 127.0.0.1:${p}\n  users:\n    - name: sensor\n      password_hash: "${hash.out.trim()}"\n      publish: ["sensors.>"]\n      subscribe: ["cmd.sensor.>"]\n`,
    );
    const a = await runAgent(join(d, "a"), ["--config", join(d, "k.yaml")]);
    const post = (path: string, body: unknown) =>
      fetch(`http://k${path}`, { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" }, unix: a.socket } as RequestInit);
    try {
      const wrong = await mqtt.connectAsync(`mqtt://127.0.0.1:${p}`, { username: "sensor", password: "nope", reconnectPeriod: 0 }).catch((e) => e);
      expect(wrong.code).toBe(4); // bad user name or password (3.1.1)
      const nobody = await mqtt.connectAsync(`mqtt://127.0.0.1:${p}`, { reconnectPeriod: 0, protocolVersion: 5 }).catch((e) => e);
      expect(nobody.code).toBe(0x86);
      const c = await mqtt.connectAsync(`mqtt://127.0.0.1:${p}`, { username: "sensor", password: "s3cret", protocolVersion: 5, reconnectPeriod: 0 });
      clients.push(c);
      await c.publishAsync("sensors/t1", "20", { qos: 1 });
      const refused = await c.publishAsync("other/t1", "20", { qos: 1 }).catch((e) => e);
      expect(refused.code ?? refused.reasonCode).toBe(0x87);
      const got: string[] = [];
      c.on("message", (t) => got.push(t));
      await c.subscribeAsync("cmd/#", { qos: 1 });
      await post("/v1/channels/cmd.other.go/messages", { type: "c", payload: 1 });
      await post("/v1/channels/cmd.sensor.go/messages", { type: "c", payload: 2 });
      await waitFor(() => got.length >= 1, "the sensor's command");
      expect(got).toEqual(["cmd/sensor/go"]);
      const stored = (await (await fetch("http://k/v1/channels", { unix: a.socket } as RequestInit)).json()) as { channels: { channel: string }[] };
      expect(stored.channels.map((x) => x.channel).sort()).toEqual(["cmd.other.go", "cmd.sensor.go", "sensors.t1"]);
    } finally {
      a.child.proc.kill("SIGTERM");
      await a.child.proc.exited;
    }
  }, 60_000);
});
