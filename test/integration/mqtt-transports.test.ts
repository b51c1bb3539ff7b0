/**
 * MQTT over TLS and over WebSocket against a real `keyop run`: devices
 * that cannot run keyop (microcontrollers) log in with a client
 * certificate from the keyop CA (its CN is the MQTT user) or a password;
 * browsers use WebSocket. What they publish is stored like any publish.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import mqtt from "mqtt";
import { freePort, tmpDir, waitFor } from "../helpers.ts";
import { cli, fleet, runAgent, type AgentProc } from "./agent-process.ts";

let dir: string;
let pki: string;
let agent: AgentProc;
const ports = { tcp: 0, tls: 0, ws: 0, wss: 0 };
const open: mqtt.MqttClient[] = [];

async function mosq(args: string[]): Promise<{ code: number; out: string; err: string }> {
  const p = Bun.spawn(args, { stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { code, out, err };
}

async function stored(channel: string): Promise<string[]> {
  const r = await fetch(`http://k/v1/channels/${channel}/messages?subscriber=t-${Math.random().toString(36).slice(2)}&from=earliest`, { unix: agent.socket } as RequestInit);
  if (r.status === 404) return [];
  return ((await r.json()) as { messages: { payload: string }[] }).messages.map((m) => m.payload);
}

beforeAll(async () => {
  dir = tmpDir();
  pki = join(dir, "pki");
  const tls = await fleet(dir, ["board", "sensor-1", "intruder"]);
  // A certificate from another CA: refused.
  const other = join(dir, "other");
  expect((await cli(["cert", "ca", "--out-dir", other])).code).toBe(0);
  expect((await cli(["cert", "issue", "--name", "sensor-1", "--ca-dir", other, "--out-dir", other])).code).toBe(0);
  const hash = (await cli(["passwd"], { stdin: "s3cret\n" })).out.trim();
  for (const k of Object.keys(ports) as (keyof typeof ports)[]) ports[k] = freePort();
  const cfg = join(dir, "board.yaml");
  writeFileSync(
    cfg,
    tls("board") +
      [
        "mqtt:",
        `  listen: 127.0.0.1:${ports.tcp}`,
        `  tls_listen: 127.0.0.1:${ports.tls}`,
        `  ws_listen: 127.0.0.1:${ports.ws}`,
        `  wss_listen: 127.0.0.1:${ports.wss}`,
        "  users:",
        "    - name: sensor-1", // certificate only: no password hash
        '      publish: ["sensors.>"]',
        '      subscribe: ["cmd.sensor-1.>"]',
        "    - name: dashboard",
        `      password_hash: "${hash}"`,
        '      publish: ["cmd.>", "ws.>"]',
        '      subscribe: [">"]',
        "",
      ].join("\n"),
  );
  agent = await runAgent(join(dir, "agent"), ["--config", cfg]);
}, 60_000);

afterAll(async () => {
  for (const c of open) await c.endAsync(true).catch(() => undefined);
  agent?.child.proc.kill("SIGTERM");
  await agent?.child.proc.exited;
});

const tlsArgs = (name: string, ca = join(pki, "ca.crt"), certDir = pki) => ["--cafile", ca, "--cert", join(certDir, `${name}.crt`), "--key", join(certDir, `${name}.key`)];

describe("MQTT over TLS", () => {
  test("a device with a certificate from the keyop CA logs in as its CN and keeps to that user's rules", async () => {
    const ok = await mosq(["mosquitto_pub", "-h", "127.0.0.1", "-p", String(ports.tls), ...tlsArgs("sensor-1"), "-t", "sensors/t1", "-m", "21.5", "-q", "1", "-V", "5"]);
    expect(ok.err).toBe("");
    expect(ok.code).toBe(0);
    await waitFor(async () => (await stored("sensors.t1")).includes("21.5"), "stored");
    // Outside its publish rules: refused with "not authorized" (MQTT 5 PUBACK 0x87).
    const denied = await mosq(["mosquitto_pub", "-h", "127.0.0.1", "-p", String(ports.tls), ...tlsArgs("sensor-1"), "-t", "cmd/x", "-m", "no", "-q", "1", "-V", "5"]);
    expect(`${denied.out}${denied.err}`).toMatch(/not authori[sz]ed/i);
    expect(await stored("cmd.x")).toEqual([]);
  });

  test("a certificate whose CN is not a user is refused at CONNECT; one from another CA is refused at the handshake", async () => {
    const unknown = await mosq(["mosquitto_pub", "-h", "127.0.0.1", "-p", String(ports.tls), ...tlsArgs("intruder"), "-t", "sensors/x", "-m", "x", "-q", "1"]);
    expect(unknown.code).not.toBe(0);
    expect(unknown.err).toMatch(/not authori[sz]ed|refused/i);
    const foreign = await mosq(["mosquitto_pub", "-h", "127.0.0.1", "-p", String(ports.tls), ...tlsArgs("sensor-1", join(pki, "ca.crt"), join(dir, "other")), "-t", "sensors/x", "-m", "x", "-q", "1"]);
    expect(foreign.code).not.toBe(0);
    expect(await stored("sensors.x")).toEqual([]);
    expect(agent.logs()).toContain("mqtt client certificate refused");
  });

  test("no certificate: a password login over TLS; a wrong password is refused", async () => {
    const base = ["mosquitto_pub", "-h", "127.0.0.1", "-p", String(ports.tls), "--cafile", join(pki, "ca.crt"), "-t", "cmd/sensor-1/led", "-q", "1", "-u", "dashboard"];
    expect((await mosq([...base, "-P", "s3cret", "-m", "on"])).code).toBe(0);
    expect((await mosq([...base, "-P", "wrong", "-m", "off"])).code).not.toBe(0);
    await waitFor(async () => (await stored("cmd.sensor-1.led")).length > 0, "stored");
    expect(await stored("cmd.sensor-1.led")).toEqual(["on"]);
  });

  test("the C device example (plain MQTT 3.1.1 over OpenSSL, as firmware does it) publishes and gets its command", async () => {
    const src = join(import.meta.dir, "..", "..", "examples", "c", "mqtt_tls_device.c");
    const bin = join(dir, "mqtt_tls_device");
    const cc = Bun.spawnSync(["cc", "-O1", "-Wall", "-Werror", "-o", bin, src, "-lssl", "-lcrypto"]);
    expect(cc.stderr.toString()).toBe("");
    const device = Bun.spawn([bin, "127.0.0.1", String(ports.tls), join(pki, "ca.crt"), join(pki, "sensor-1.crt"), join(pki, "sensor-1.key"), "sensor-1"], { stdout: "pipe", stderr: "pipe" });
    // The device subscribes to its command topic, then publishes; the dashboard answers its telemetry.
    const dash = await mqtt.connectAsync(`mqtt://127.0.0.1:${ports.tcp}`, { username: "dashboard", password: "s3cret", clientId: "dash-c", reconnectPeriod: 0 });
    open.push(dash);
    dash.on("message", (topic) => topic === "sensors/sensor-1/temp" && dash.publish("cmd/sensor-1/set", "interval=30", { qos: 1 }));
    await dash.subscribeAsync("sensors/sensor-1/temp", { qos: 1 });
    const [out, err, code] = await Promise.all([new Response(device.stdout).text(), new Response(device.stderr).text(), device.exited]);
    expect(err).toBe("");
    expect(code).toBe(0);
    expect(out).toContain("published sensors/sensor-1/temp");
    expect(out).toContain("command cmd/sensor-1/set: interval=30");
    expect(await stored("sensors.sensor-1.temp")).toContain("22.5");
  }, 30_000);
});

describe("MQTT over WebSocket", () => {
  test("ws: mqtt.js (as a browser dashboard would) publishes and subscribes, subprotocol mqtt", async () => {
    const c = await mqtt.connectAsync(`ws://127.0.0.1:${ports.ws}/mqtt`, { username: "dashboard", password: "s3cret", clientId: "ws-1", reconnectPeriod: 0, protocolVersion: 5 });
    open.push(c);
    const got: string[] = [];
    c.on("message", (t, p) => got.push(`${t}=${p}`));
    await c.subscribeAsync("ws/#", { qos: 1 });
    await c.publishAsync("ws/hello", "from a browser", { qos: 1 });
    await waitFor(() => got.length === 1, "the message back");
    expect(got).toEqual(["ws/hello=from a browser"]);
    expect(await stored("ws.hello")).toEqual(["from a browser"]);
  });

  test("wss: the same over TLS, the keyop CA trusted", async () => {
    const c = await mqtt.connectAsync(`wss://127.0.0.1:${ports.wss}/mqtt`, { username: "dashboard", password: "s3cret", clientId: "wss-1", reconnectPeriod: 0, ca: readFileSync(join(pki, "ca.crt")) });
    open.push(c);
    await c.publishAsync("ws/secure", "over tls", { qos: 1 });
    await waitFor(async () => (await stored("ws.secure")).length === 1, "stored");
    // A plain HTTP request to the WebSocket port is told what it is.
    const r = await fetch(`http://127.0.0.1:${ports.ws}/`);
    expect(r.status).toBe(426);
  });
});
