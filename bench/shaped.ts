/**
 * Step 8 of `npm run bench:compare`: a board on a slow link. JSON telemetry
 * is queued on the board while its link is down; the link comes up through
 * a shaper (the fault proxy's token bucket and fixed delay: 32 KiB/s and
 * 150 ms each way, as a cellular or satellite path), and an alarm is
 * published 2 s into the drain.
 *
 * Reported per system: the alarm's latency from publish on the board to
 * arrival at the hub, the time to drain the backlog, the bytes that crossed
 * the path per message (TLS and protocol included), and the board's CPU
 * per message during the drain. keyop runs with its link's bandwidth cap
 * just below the path's rate and an alarm lane (priority 0), with zstd and
 * without compression; Mosquitto with a QoS 1 bridge on the same shaper,
 * where the alarm queues behind the backlog (no priorities, no cap, no
 * compression).
 *
 * Bound by: the shaped path, on every side (this machine's CPU is idle
 * most of the run).
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import mqtt from "mqtt";
import { createCa, issueCert } from "../src/pki/certs.ts";
import { FaultProxy } from "../test/integration/fault-proxy.ts";
import { channelMessages, type Proc, start, status, stop, until } from "./fed-lib.ts";
import type { Row } from "./lib.ts";
import { cpuOf, freePort, type Servers } from "./servers.ts";

export interface ShapedOptions {
  servers: Servers;
  quick: boolean;
  /** Run only the cases whose names contain this. */
  only?: string | undefined;
}

/** The path: bytes per second each way, and the delay each way. */
const RATE = 32 * 1024;
const DELAY_MS = 150;
/** keyop's cap on the link: just below the path's rate, so the path's queue stays empty. */
const CAP = 30 * 1024;
const ALARM_AFTER_MS = 2000;

/** A JSON telemetry reading of about 200 bytes, as a board sends them. */
function reading(i: number): Record<string, unknown> {
  return {
    device: "board-17",
    sensor: i % 2 ? "engine-room-temperature" : "hull-vibration-rms",
    seq: i,
    value: Math.round((20 + Math.sin(i / 50) * 5) * 100) / 100,
    unit: i % 2 ? "celsius" : "mm/s",
    ts: 1_795_940_853_240 + i * 1000,
  };
}

/** What one system did on the shaped link. */
interface ShapedResult {
  system: string;
  alarmMs: number;
  drainS: number;
  bytesPerMsg: number;
  boardCpuUsPerMsg: number;
}

function shaper(target: number): FaultProxy {
  const p = new FaultProxy(target);
  p.rateBytesPerS = RATE;
  p.delayMs = DELAY_MS;
  p.refusing = true; // the link is down until the backlog is queued
  return p;
}

async function keyopCase(o: ShapedOptions, n: number, compression: "auto" | "none"): Promise<ShapedResult> {
  const dir = o.servers.dir(`shaped-keyop-${compression}`);
  const ca = await createCa();
  writeFileSync(join(dir, "ca.crt"), ca.certPem);
  for (const name of ["hub", "board"]) {
    const c = await issueCert(ca, { name, ip: ["127.0.0.1"] });
    writeFileSync(join(dir, `${name}.crt`), c.certPem);
    writeFileSync(join(dir, `${name}.key`), c.keyPem);
  }
  const tls = (name: string) => `tls:\n  cert: ${dir}/${name}.crt\n  key: ${dir}/${name}.key\n  ca: ${dir}/ca.crt\n`;
  const port = freePort();
  const proxy = shaper(port);
  const procs: Proc[] = [];
  try {
    const hub = await start(dir, "hub", tls("hub") + `hub:\n  listen: 127.0.0.1:${port}\n  peers:\n    - {name: board, publish: ["telemetry.>", "alarm.>"], subscribe: []}\n`);
    procs.push(hub);
    const board = await start(
      dir,
      "board",
      tls("board") +
        `federation:\n  reconnect_base_ms: 100ms\n  reconnect_max_ms: 500ms\n  compression: ${compression}\n` +
        `links:\n  - hub: 127.0.0.1:${proxy.port}\n    publish: [{pattern: "alarm.>", priority: 0}, "telemetry.>"]\n    start: earliest\n    max_bytes_per_s: ${CAP}\n`,
    );
    procs.push(board);
    for (let i = 0; i < n; i += 1000) {
      const body = Array.from({ length: Math.min(1000, n - i) }, (_, k) => JSON.stringify({ type: "reading", payload: reading(i + k) })).join("\n");
      const r = await fetch("http://k/v1/channels/telemetry.engine/messages", { method: "POST", body, headers: { "content-type": "application/x-ndjson" }, unix: board.socket } as RequestInit);
      if (r.status !== 201) throw new Error(`publish to the board: HTTP ${r.status}`);
    }
    const bytes0 = proxy.bytes().up;
    const cpu0 = cpuOf(board.proc.pid);
    proxy.refusing = false;
    await until("the board's link up", async () => (await status(board)).links[0]?.state === "open", 30_000);
    const up = performance.now();
    await Bun.sleep(ALARM_AFTER_MS);
    const r = await fetch("http://k/v1/channels/alarm.fire/messages", {
      method: "POST",
      body: JSON.stringify({ type: "alarm", payload: { zone: 3 } }),
      headers: { "content-type": "application/json" },
      unix: board.socket,
    } as RequestInit);
    const published = performance.now();
    if (r.status !== 201) throw new Error(`alarm publish: HTTP ${r.status}`);
    let alarmMs = NaN;
    await until(
      "the alarm at the hub",
      async () => {
        if ((await channelMessages(hub, "alarm.fire")) < 1) return false;
        alarmMs = performance.now() - published;
        return true;
      },
      600_000,
      10,
    );
    await until("the backlog at the hub", async () => (await channelMessages(hub, "telemetry.engine")) >= n, 900_000, 50);
    const drainS = (performance.now() - up) / 1000;
    return {
      system: `keyop, ${compression === "auto" ? "zstd" : "no compression"}`,
      alarmMs,
      drainS,
      bytesPerMsg: (proxy.bytes().up - bytes0) / n,
      boardCpuUsPerMsg: ((cpuOf(board.proc.pid) - cpu0) * 1e6) / n,
    };
  } finally {
    proxy.stop();
    for (const p of procs.reverse()) await stop(p);
  }
}

async function mosquittoCase(o: ShapedOptions, n: number): Promise<ShapedResult> {
  const hubPort = freePort();
  const proxy = shaper(hubPort);
  const hub = await o.servers.mosquitto("shaped-mq-hub", "", hubPort);
  const bridge = `\nconnection hub\naddress 127.0.0.1:${proxy.port}\ntopic bench/# out 1\ncleansession false\nclientid bridge-shaped-board\nrestart_timeout 1\nstart_type automatic\ntry_private true\nnotifications false\nbridge_protocol_version mqttv311\n`;
  const board = await o.servers.mosquitto("shaped-mq-board", bridge);
  const sub = await mqtt.connectAsync(`mqtt://127.0.0.1:${hub.port}`, { clean: true });
  const pub = await mqtt.connectAsync(`mqtt://127.0.0.1:${board.port}`, { clean: true });
  try {
    let telemetry = 0;
    let alarmAt = NaN;
    let firstAt = NaN;
    sub.on("message", (topic) => {
      if (topic === "bench/alarm") alarmAt = performance.now();
      else {
        if (telemetry === 0) firstAt = performance.now();
        telemetry++;
      }
    });
    await sub.subscribeAsync("bench/#", { qos: 1 });
    for (let i = 0; i < n; i += 500) {
      await Promise.all(Array.from({ length: Math.min(500, n - i) }, (_, k) => pub.publishAsync("bench/telemetry/engine", JSON.stringify(reading(i + k)), { qos: 1 })));
    }
    const bytes0 = proxy.bytes().up;
    const cpu0 = cpuOf(board.proc.pid);
    proxy.refusing = false;
    // The bridge is up when the first queued message arrives.
    await until("the bridge up", async () => telemetry > 0, 60_000, 10);
    await Bun.sleep(Math.max(0, firstAt + ALARM_AFTER_MS - performance.now()));
    await pub.publishAsync("bench/alarm", JSON.stringify({ zone: 3 }), { qos: 1 });
    const published = performance.now();
    await until("the backlog at the hub", async () => telemetry >= n && Number.isFinite(alarmAt), 900_000, 50);
    return {
      system: "mosquitto bridge",
      alarmMs: alarmAt - published,
      drainS: (performance.now() - firstAt) / 1000,
      bytesPerMsg: (proxy.bytes().up - bytes0) / n,
      boardCpuUsPerMsg: ((cpuOf(board.proc.pid) - cpu0) * 1e6) / n,
    };
  } finally {
    await pub.endAsync(true);
    await sub.endAsync(true);
    proxy.stop();
    await o.servers.kill(board);
    await o.servers.kill(hub);
  }
}

/** Runs the shaped-link cases; rows for the results table. */
export async function shapedLink(o: ShapedOptions): Promise<Row[]> {
  const n = o.quick ? 2000 : 20_000;
  const G = "8 shaped link";
  const rows: Row[] = [];
  const cases: [string, () => Promise<ShapedResult>][] = [
    ["keyop zstd", () => keyopCase(o, n, "auto")],
    ["keyop none", () => keyopCase(o, n, "none")],
    ["mosquitto", () => mosquittoCase(o, n)],
  ];
  const results: ShapedResult[] = [];
  for (const [name, run] of cases) {
    if (o.only && !`shaped ${name}`.includes(o.only) && !o.only.startsWith("8 shaped")) continue;
    console.log(`  shaped link: ${name}`);
    const r = await run();
    results.push(r);
    const note = `${n.toLocaleString("en-US")} JSON readings queued while down, then ${RATE / 1024} KiB/s and ${DELAY_MS} ms each way`;
    rows.push({
      group: G,
      metric: `${r.system}: alarm latency, published ${ALARM_AFTER_MS / 1000} s into the drain`,
      value: r.alarmMs,
      unit: "ms",
      note: r.system.startsWith("keyop") ? `< 1000: ${r.alarmMs < 1000 ? "met" : "MISSED"}` : "FIFO behind the backlog",
    });
    rows.push({ group: G, metric: `${r.system}: time to drain the backlog`, value: r.drainS, unit: "s", note });
    rows.push({
      group: G,
      metric: `${r.system}: bytes on the path per message`,
      value: r.bytesPerMsg,
      unit: "B",
      note: r.system.startsWith("keyop") ? "mutual TLS and protocol included" : "plain TCP (no TLS), protocol included",
    });
    rows.push({ group: G, metric: `${r.system}: board CPU per message during the drain`, value: r.boardCpuUsPerMsg, unit: "µs" });
  }
  const z = results.find((r) => r.system === "keyop, zstd");
  const plain = results.find((r) => r.system === "keyop, no compression");
  if (z && plain)
    rows.push({
      group: G,
      metric: "keyop bytes per message, no compression / zstd",
      value: plain.bytesPerMsg / z.bytesPerMsg,
      unit: "x",
      note: `>= 3: ${plain.bytesPerMsg >= 3 * z.bytesPerMsg ? "met" : "MISSED"}`,
    });
  const mq = results.find((r) => r.system === "mosquitto bridge");
  if (z && mq) rows.push({ group: G, metric: "mosquitto bridge / keyop zstd, bytes per message", value: mq.bytesPerMsg / z.bytesPerMsg, unit: "x" });
  return rows;
}
