/**
 * Device B's path of one message inside one process, without sockets or
 * other processes: a BATCH frame from the hub goes into B's link session,
 * the `Receiver` stores it in B's log (`sync: none`), the agent's MQTT
 * listener delivers it to a QoS 1 subscriber's session, and the PUBLISH
 * comes out of that session's outbound queue as the socket would take it;
 * the subscriber's PUBACK goes back a turn later, as a client's would. The
 * link's ACKs to the hub are taken and dropped.
 *
 * What keyop's own code costs per message on the last hop of the two-hop
 * path, apart from the kernel, TLS and the clients: for A/B of a change,
 * with far less noise than the `steady: two hops` step. Its sibling
 * benchmarks are hub-path.ts (the middle hop) and mqtt-path.ts (the first).
 *
 *   bun bench/device-path.ts [--n=20000] [--warm=60000] [--segments=5] [--rate=1000] [--sync=none|always] [--cells=300]
 *
 * One JSON line, of the median of the measured segments: CPU and wall time per message, minor page faults and
 * voluntary context switches per message, RSS, CPU of each kind of thread.
 */
import { rmSync } from "node:fs";
import mqtt, { type Packet } from "mqtt-packet";
import { tuneRuntime } from "../src/cli/runtime-options.ts";
import { RecentIds } from "../src/federation/dedup.ts";
import { clientHello, welcomeFrame } from "../src/federation/messages.ts";
import { Receiver } from "../src/federation/receiver.ts";
import { PeerSession } from "../src/federation/session.ts";
import { messengerSink } from "../src/federation/sink.ts";
import { MqttSession, queueWire } from "../src/mqtt/session.ts";
import { OutQueue } from "../src/net/out-queue.ts";
import { silentLogger } from "../src/observability/logger.ts";
import { Arrivals, cellsPerInput, measure, mqttAgent, oneRecordBatches, pathOptions, report } from "./self-stats.ts";

// With the allocator and the JIT as `keyop run` sets them (this re-executes the script once).
tuneRuntime();

const opts = pathOptions();
const { n: N, rate: RATE, sync: SYNC } = opts;

const { agent, dir } = await mqttAgent("b", SYNC);

// The subscriber: PUBLISHes counted as they leave the listener's outbound queue, each answered with a PUBACK a turn later.
const delivered = new Arrivals();
const pubacks: number[] = [];
let session: MqttSession | null = null;
const answer = () => {
  const acks = new Uint8Array(pubacks.length * 4);
  for (let i = 0; i < pubacks.length; i++) acks.set([0x40, 2, pubacks[i]! >> 8, pubacks[i]! & 0xff], i * 4);
  pubacks.length = 0;
  session!.data(acks);
};
const out = new OutQueue((bytes) => {
  let n = 0;
  for (let i = 0; i < bytes.length; ) {
    const type = bytes[i]!;
    let len = 0;
    let shift = 0;
    let j = i + 1;
    for (;;) {
      const b = bytes[j++]!;
      len += (b & 0x7f) << shift;
      shift += 7;
      if (b < 0x80) break;
    }
    if (type >> 4 === 3 && (type & 0x06) === 0x02) {
      const topicLen = (bytes[j]! << 8) | bytes[j + 1]!;
      const at = j + 2 + topicLen;
      if (pubacks.length === 0) setImmediate(answer);
      pubacks.push((bytes[at]! << 8) | bytes[at + 1]!);
      n++;
    }
    i = j + len;
  }
  delivered.add(n);
  return bytes.length;
}, 1 << 20);
session = new MqttSession(
  agent.mqtt!,
  queueWire(out, () => {}),
);
session.data(mqtt.generate({ cmd: "connect", protocolId: "MQTT", protocolVersion: 4, clean: true, clientId: "bench-sub", keepalive: 0 } as Packet));
session.data(mqtt.generate({ cmd: "subscribe", messageId: 1, subscriptions: [{ topic: "down/t", qos: 1 }] } as Packet));

// B's link session: the hub's frames are fed to `fromHub.receive`; B's ACKs to the hub are dropped.
const receiver = new Receiver({ sink: messengerSink(agent.messenger), self: "b", dedup: new RecentIds(100_000), logger: silentLogger });
const fromHub = new PeerSession(
  { write: (b) => b.length, end() {}, terminate() {} },
  { name: "hub", fingerprint: "fp-hub", notAfter: new Date(Date.now() + 86_400_000) },
  { maxBody: (1 << 20) + 65_536, heartbeatMs: 5_000, logger: silentLogger, role: "client" },
  { onBatch: (s, b) => receiver.handle(s, b) },
);
fromHub.sendHello(clientHello({ name: "b", mode: "link", publish: [], subscribe: ["down.>"], heartbeatMs: 5_000, maxBatchBytes: 1 << 20 }));
fromHub.receive(welcomeFrame({ version: 1, name: "hub", publish: [], subscribe: ["down.>"], heartbeatMs: 5_000, maxBatchBytes: 1 << 20 }));
await Bun.sleep(20);

// The hub's BATCH frames, one record each, as its forwarder writes them.
const nextFrame = oneRecordBatches("down.t");

const feed = (f: Uint8Array) => fromHub.receive(f);
const workload = RATE > 0 ? `device path @${RATE}/s` : "device path, one at a time";
console.log(opts.cells > 0 ? await cellsPerInput("device path", nextFrame, feed, delivered, opts.warm, opts.cells) : report(workload, SYNC, N, await measure(nextFrame, feed, delivered, opts)));
session.socketClosed();
fromHub.close("bye", "done", { hard: true });
await agent.stop();
rmSync(dir, { recursive: true, force: true });
process.exit(0);
