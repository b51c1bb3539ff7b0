/**
 * MQTT QoS 1 ingest of two builds of keyop side by side: an A/B of a change
 * to the listener's or the log's commit path at many messages in flight,
 * which `npm run bench:compare -- --only="ingest: mqtt"` measures against
 * Mosquitto and the bare sink but not against another build. The disk's
 * fdatasync latency and this machine's speed drift from minute to minute;
 * alternating rounds of the two (A B, B A, ...) put the drift on both.
 *
 *   bun bench/ingest-pair.ts [--a=<work tree>] [--b=<work tree>] [--env-a="K=V ..."] [--env-b="K=V ..."]
 *                            [--sync=always|none] [--inflight=64] [--secs=4] [--pairs=8]
 *
 * One agent per build, each with its MQTT listener, one mqtt.js client
 * each (this process), `inflight` publishes of 256 bytes kept in flight for
 * `secs` per round. Per round: messages a second, the agent's CPU per
 * message (all threads, from /proc) and of it the thread pool's (where
 * fdatasyncs of large commits run), and this client's CPU (which side is
 * bound by what). It prints each pair and one JSON line: the medians of B/A
 * per pair for the rate and the server CPU per message.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import mqtt from "mqtt";
import { type Proc, start, stop } from "./fed-lib.ts";
import { alternating, arg, diskFloorUs, envOf, quantile, workers } from "./lib.ts";
import { portOpen, until } from "./procs.ts";
import { costBetween, freePort, snapshotOf } from "./servers.ts";

const sync = arg("sync", "always");
const inflight = Number(arg("inflight", "64"));
const secs = Number(arg("secs", "4"));
const pairs = Number(arg("pairs", "8"));
const PAYLOAD = Buffer.alloc(256, 120);

interface Side {
  tree: string;
  env: Record<string, string>;
  dir: string;
  agent: Proc;
  client: mqtt.MqttClient;
}

async function side(label: string, tree: string, env: Record<string, string>): Promise<Side> {
  const dir = mkdtempSync(join(process.env.KEYOP_BENCH_DIR ?? tmpdir(), `keyop-ingest-pair-${label}-`));
  const port = freePort();
  const agent = await start(dir, "agent", `mqtt:\n  listen: 127.0.0.1:${port}\n`, sync, { main: join(tree, "src", "main.ts"), env });
  await until("mqtt listening", portOpen(port), 20_000);
  const client = await mqtt.connectAsync(`mqtt://127.0.0.1:${port}`, { clean: true, clientId: `ingest-pair-${label}` });
  return { tree, env, dir, agent, client };
}

/** `inflight` loops, each publishing the next message once its PUBACK came, for `s` seconds; messages a second. */
const publishFor = (c: mqtt.MqttClient, s: number) => workers(inflight, s, () => c.publishAsync("bench/in", PAYLOAD, { qos: 1 }));

interface Round {
  rate: number;
  /** The agent's CPU per message, µs, and of it the thread pool's. */
  cpuUs: number;
  poolUs: number;
  /** This process's (the client's) share of a core. */
  clientBusy: number;
  /** The disk's write + fdatasync right before the round, µs. */
  diskUs: number;
}

async function round(s: Side): Promise<Round> {
  const diskUs = diskFloorUs(s.dir, 100);
  const c0 = snapshotOf([s.agent.proc.pid]);
  const u0 = process.cpuUsage();
  const t0 = performance.now();
  const rate = await publishFor(s.client, secs);
  const wall = (performance.now() - t0) * 1000;
  const u = process.cpuUsage(u0);
  const c = costBetween(c0, snapshotOf([s.agent.proc.pid]));
  const msgs = rate * secs;
  return { rate, cpuUs: (c.cpu / msgs) * 1e6, poolUs: ((c.byKind.pool ?? 0) / msgs) * 1e6, clientBusy: (u.user + u.system) / wall, diskUs };
}

const fmt = (r: Round) => `${Math.round(r.rate)} msg/s, server ${r.cpuUs.toFixed(2)} µs/msg (pool ${r.poolUs.toFixed(2)}), client ${(r.clientBusy * 100).toFixed(0)}%, disk ${r.diskUs.toFixed(0)} µs`;

const a = await side("a", resolve(arg("a", ".")), envOf(arg("env-a", "")));
const b = await side("b", resolve(arg("b", ".")), envOf(arg("env-b", "")));
try {
  // Warm-up, untimed: the JIT of both agents, the first segments' allocation.
  for (const s of [a, b]) await publishFor(s.client, 6);
  const rate: number[] = [];
  const cpu: number[] = [];
  await alternating(
    pairs,
    () => round(a),
    () => round(b),
    (x, y, i) => {
      rate.push(y.rate / x.rate);
      cpu.push(y.cpuUs / x.cpuUs);
      console.log(`pair ${i + 1}: A ${fmt(x)} | B ${fmt(y)} | rate B/A ${(y.rate / x.rate).toFixed(3)}`);
    },
  );
  console.log(
    JSON.stringify({
      workload: `MQTT QoS 1 ingest, ${inflight} in flight, side by side`,
      sync,
      pairs,
      secs,
      rateBOverA: +quantile([...rate], 0.5).toFixed(3),
      cpuBOverA: +quantile([...cpu], 0.5).toFixed(3),
      pairsWithBFaster: rate.filter((r) => r > 1).length,
      a: { tree: a.tree, env: a.env },
      b: { tree: b.tree, env: b.env },
    }),
  );
} finally {
  for (const s of [a, b]) {
    await s.client.endAsync();
    await stop(s.agent);
    rmSync(s.dir, { recursive: true, force: true });
  }
}
