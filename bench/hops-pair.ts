/**
 * Two builds of keyop side by side, over two hops or as one broker: an A/B
 * of a change to the message path that holds up while this machine's speed
 * drifts (one run of the steady step moves by 15-25% from one hour, or one
 * minute, to the next; a change worth a few percent needs both sides in
 * the same minutes).
 *
 *   bun bench/hops-pair.ts [--a=<work tree>] [--b=<work tree>] [--env-a="K=V ..."] [--env-b="K=V ..."]
 *                          [--hops=2|0] [--sync=none|always] [--rate=1000] [--secs=5] [--pairs=12] [--warm-secs=20]
 *
 * Two setups, one per build, run at once; A and B may be two work trees,
 * or one tree with two environments (a runtime option). With `--hops=2` a
 * setup is a trio (device A, hub, device B over mutual TLS, MQTT on both
 * devices): this process publishes MQTT QoS 1 to device A at `rate` for
 * `secs` while subscribed on device B, and the latency is publish to
 * delivery. With `--hops=0` it is one agent with its MQTT listener, and the
 * latency is publish to PUBACK. After a burst to one setup it waits for
 * every message, then does the same with the other, in the order A B, B A,
 * A B... so that a drift within a pair falls on both; the setup not in its
 * burst is idle. Per burst: the CPU of the setup's agents per message (per
 * thread, from /proc, as `bench/steady.ts` reads it), of which the JIT
 * compiler's threads, wake-ups per message, p50 and p99, and RSS. Each
 * setup first warms up as the steady step does (60,000 messages at
 * 4,000/s, then `warm-secs` at the rate). It prints each pair and one JSON
 * line: the medians of B/A per pair for CPU and p99, how many pairs had
 * B's CPU lower, and each side's percentiles over all its bursts' messages
 * together (steadier than a median of per-burst p99s).
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import mqtt from "mqtt";
import { type Build, type Proc, start, startTrio, stop } from "./fed-lib.ts";
import { alternating, arg, envOf, pace, quantile } from "./lib.ts";
import { portOpen, until } from "./procs.ts";
import { costBetween, freePort, snapshotOf } from "./servers.ts";

const sync = arg("sync", "none");
const rate = Number(arg("rate", "1000"));
const secs = Number(arg("secs", "5"));
const pairs = Number(arg("pairs", "12"));
const warmSecs = Number(arg("warm-secs", "20"));
const hops = Number(arg("hops", "2"));
if (hops !== 0 && hops !== 2) throw new Error("--hops is 2 (a trio) or 0 (one broker)");
const WARM_MESSAGES = 60_000;
const WARM_RATE = 4000;
const PAD = "x".repeat(200);

interface Side {
  label: string;
  tree: string;
  env: Record<string, string>;
  dir: string;
  /** The agents on the path, in its order. */
  agents: Proc[];
  pub: mqtt.MqttClient;
  sub: mqtt.MqttClient | null;
  got: number;
  sent: number;
  lat: number[];
}

const mqttYaml = (port: number) => `mqtt:\n  listen: 127.0.0.1:${port}\n`;

async function side(label: string, tree: string, env: Record<string, string>): Promise<Side> {
  const dir = mkdtempSync(join(process.env.KEYOP_BENCH_DIR ?? tmpdir(), `keyop-hops-pair-${label}-`));
  const build: Build = { main: join(tree, "src", "main.ts"), env };
  if (hops === 0) {
    const port = freePort();
    const agent = await start(dir, "agent", mqttYaml(port), sync, build);
    await until("mqtt listening", portOpen(port), 20_000);
    const pub = await mqtt.connectAsync(`mqtt://127.0.0.1:${port}`, { clean: true });
    return { label, tree, env, dir, agents: [agent], pub, sub: null, got: 0, sent: 0, lat: [] };
  }
  const ports = { devA: freePort(), devB: freePort() };
  const trio = await startTrio(dir, { pattern: "bench.>", sync, build, deviceYaml: (n) => mqttYaml(ports[n]) });
  await until("mqtt listening", async () => (await portOpen(ports.devA)()) && portOpen(ports.devB)(), 20_000);
  const sub = await mqtt.connectAsync(`mqtt://127.0.0.1:${ports.devB}`, { clean: true });
  await sub.subscribeAsync("bench/pair", { qos: 1 });
  const pub = await mqtt.connectAsync(`mqtt://127.0.0.1:${ports.devA}`, { clean: true });
  const s: Side = { label, tree, env, dir, agents: [trio.devA, trio.hub, trio.devB], pub, sub, got: 0, sent: 0, lat: [] };
  sub.on("message", (_t, p) => {
    s.got++;
    s.lat.push(performance.timeOrigin + performance.now() - JSON.parse(p.toString()).t);
  });
  return s;
}

const send = (s: Side) => () => {
  s.sent++;
  const t = performance.timeOrigin + performance.now();
  const acked = s.pub.publishAsync("bench/pair", JSON.stringify({ t, pad: PAD }), { qos: 1 });
  if (s.sub) return acked;
  // One broker: a message is through once it is acknowledged.
  return acked.then(() => {
    s.got++;
    s.lat.push(performance.timeOrigin + performance.now() - t);
  });
};

/** Waits until every message sent to `s` arrived (or none came for 3 s: then the burst is reported short). */
async function drained(s: Side): Promise<void> {
  let last = -1;
  let since = performance.now();
  while (s.got < s.sent) {
    if (s.got !== last) {
      last = s.got;
      since = performance.now();
    } else if (performance.now() - since > 3000) return;
    await Bun.sleep(5);
  }
}

/** VmRSS of `pid` in MB. */
const rssOf = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0) / 1024;

const pidsOf = (s: Side) => s.agents.map((p) => p.proc.pid);

interface Burst {
  cpuUs: number;
  /** Of which the JIT compiler's threads. */
  jitUs: number;
  wakeups: number;
  p50: number;
  p99: number;
  lost: number;
  /** Resident memory of the agents at the end, MB. */
  rssMB: number;
  /** Every message's latency, ms. */
  lat: number[];
}

async function burst(s: Side): Promise<Burst> {
  const total = Math.round(rate * secs);
  s.lat = [];
  const got0 = s.got;
  const s0 = snapshotOf(pidsOf(s));
  await pace(rate, total, 64, send(s));
  await drained(s);
  const c = costBetween(s0, snapshotOf(pidsOf(s)));
  return {
    cpuUs: (c.cpu / total) * 1e6,
    jitUs: ((c.byKind.jit ?? 0) / total) * 1e6,
    wakeups: c.wakeups / total,
    p50: quantile([...s.lat], 0.5),
    p99: quantile([...s.lat], 0.99),
    lost: total - (s.got - got0),
    rssMB: pidsOf(s).reduce((m, pid) => m + rssOf(pid), 0),
    lat: s.lat,
  };
}

const fmt = (b: Burst) =>
  `${b.cpuUs.toFixed(1)} µs/msg (JIT ${b.jitUs.toFixed(1)}) ${b.wakeups.toFixed(2)} wake-ups p50 ${b.p50.toFixed(2)} p99 ${b.p99.toFixed(2)} ms RSS ${b.rssMB.toFixed(0)} MB${b.lost ? ` LOST ${b.lost}` : ""}`;

const a = await side("a", resolve(arg("a", ".")), envOf(arg("env-a", "")));
const b = await side("b", resolve(arg("b", ".")), envOf(arg("env-b", "")));
try {
  for (const s of [a, b]) {
    await pace(WARM_RATE, WARM_MESSAGES, 64, send(s));
    await pace(rate, Math.round(rate * warmSecs), 64, send(s));
    await drained(s);
  }
  const cpu: number[] = [];
  const nonJit: number[] = [];
  const p99: number[] = [];
  // Every burst's latencies pooled per side: a burst's p99 rests on its 50 slowest messages and moves a lot from one to the next.
  const pooled: { a: number[]; b: number[] } = { a: [], b: [] };
  await alternating(
    pairs,
    () => burst(a),
    () => burst(b),
    (x, y, i) => {
      cpu.push(y.cpuUs / x.cpuUs);
      nonJit.push((y.cpuUs - y.jitUs) / (x.cpuUs - x.jitUs));
      p99.push(y.p99 / x.p99);
      for (const v of x.lat) pooled.a.push(v);
      for (const v of y.lat) pooled.b.push(v);
      console.log(`pair ${i + 1}: A ${fmt(x)} | B ${fmt(y)} | B/A ${(y.cpuUs / x.cpuUs).toFixed(3)}`);
    },
  );
  console.log(
    JSON.stringify({
      workload: `${hops === 2 ? "two hops" : "one broker"} @${rate}/s, side by side`,
      sync,
      pairs,
      secs,
      cpuBOverA: +quantile([...cpu], 0.5).toFixed(3),
      // Without the JIT compiler's threads, whose recompiles come and go from one burst to the next.
      cpuWithoutJitBOverA: +quantile([...nonJit], 0.5).toFixed(3),
      p99BOverA: +quantile([...p99], 0.5).toFixed(3),
      pooledMs: Object.fromEntries(
        (["a", "b"] as const).map((k) => [k, { p50: +quantile([...pooled[k]], 0.5).toFixed(3), p99: +quantile([...pooled[k]], 0.99).toFixed(3), p999: +quantile([...pooled[k]], 0.999).toFixed(3) }]),
      ),
      pooledP99BOverA: +(quantile([...pooled.b], 0.99) / quantile([...pooled.a], 0.99)).toFixed(3),
      pairsWithBLower: cpu.filter((r) => r < 1).length,
      a: { tree: a.tree, env: a.env },
      b: { tree: b.tree, env: b.env },
    }),
  );
} finally {
  for (const s of [a, b]) {
    await s.pub.endAsync();
    await s.sub?.endAsync();
    for (const p of s.agents) await stop(p);
    rmSync(s.dir, { recursive: true, force: true });
  }
}
