/**
 * The MQTT listener's path of one QoS 1 publish inside one process, without
 * sockets: PUBLISH bytes go into an `MqttSession` of a real agent's
 * listener, the message is stored in a real log, and the PUBACK comes out
 * of the session's outbound queue as the socket would take it.
 *
 * What keyop's own code costs per message on the one-broker path, apart
 * from the kernel's TCP and the client: CPU (process.cpuUsage, all
 * threads) per message, one message at a time (each waits for the PUBACK
 * of the one before: a board's rate as the agent sees it) or paced at a
 * fixed rate. For A/B of a change, with far less noise than the
 * `steady: one broker` step. With `--burst=K` each input is K publishes in
 * one read, as a client with many in flight sends them (the ingest path:
 * they share one write and their PUBACKs one socket write); figures stay
 * per message.
 *
 *   bun bench/mqtt-path.ts [--n=20000] [--warm=60000] [--segments=5] [--rate=1000] [--sync=none|always] [--burst=16] [--cells=300]
 *
 * One JSON line, of the median of the measured segments: CPU and wall time per message, minor page faults and
 * voluntary context switches per message, RSS, CPU of each kind of thread.
 */
import { rmSync } from "node:fs";
import mqtt, { type Packet } from "mqtt-packet";
import { tuneRuntime } from "../src/cli/runtime-options.ts";
import { MqttSession, queueWire } from "../src/mqtt/session.ts";
import { OutQueue } from "../src/net/out-queue.ts";
import { Arrivals, cellsPerInput, measure, mqttAgent, pathOptions, report } from "./self-stats.ts";

// With the allocator and the JIT as `keyop run` sets them (this re-executes the script once).
tuneRuntime();

const opts = pathOptions();
const { n: N, rate: RATE, sync: SYNC } = opts;
const BURST = Math.max(1, Number(process.argv.find((a) => a.startsWith("--burst="))?.slice(8) ?? 1));

const { agent, dir } = await mqttAgent("agent", SYNC);

// The PUBACKs as the socket would take them, through the listener's outbound queue.
const acked = new Arrivals();
const out = new OutQueue((bytes) => {
  let n = 0;
  for (let i = 0; i < bytes.length; i += 4) if (bytes[i] === 0x40) n++;
  // Counted in inputs: an input is done when all its publishes are acknowledged.
  acked.add(n / BURST);
  return bytes.length;
}, 1 << 20);
const session = new MqttSession(
  agent.mqtt!,
  queueWire(out, () => {}),
);
session.data(mqtt.generate({ cmd: "connect", protocolId: "MQTT", protocolVersion: 4, clean: true, clientId: "bench", keepalive: 0 } as Packet));
await Bun.sleep(20);

// The same 256-byte messages as the steady workload's publisher: a time stamp and padding.
const PAD = "x".repeat(200);
let pid = 0;
function onePublish(): Uint8Array {
  pid = (pid % 65_535) + 1;
  const payload = Buffer.from(JSON.stringify({ t: performance.timeOrigin + performance.now(), pad: PAD }));
  return mqtt.generate({ cmd: "publish", topic: "bench/steady", payload, qos: 1, messageId: pid, retain: false, dup: false } as Packet);
}
const nextPublish = (): Uint8Array => (BURST === 1 ? onePublish() : Buffer.concat(Array.from({ length: BURST }, onePublish)));

const feed = (p: Uint8Array) => session.data(p);
const workload = `mqtt path${BURST > 1 ? `, ${BURST} a read` : ""}, ${RATE > 0 ? `@${RATE}/s` : "one at a time"}`;
console.log(
  opts.cells > 0
    ? await cellsPerInput(BURST > 1 ? `mqtt path, ${BURST} a read` : "mqtt path", nextPublish, feed, acked, opts.warm, opts.cells)
    : report(workload, SYNC, N * BURST, await measure(nextPublish, feed, acked, opts)),
);
session.socketClosed();
await agent.stop();
rmSync(dir, { recursive: true, force: true });
process.exit(0);
