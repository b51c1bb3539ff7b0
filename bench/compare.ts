/**
 * `npm run bench:compare`: keyop side by side with Mosquitto and NATS on this
 * machine, in one run, with one client harness (this process), every server
 * on loopback with its config from bench/configs/. Installs what is missing
 * (Debian mosquitto and nats-server), stops everything it started, prints a
 * table, writes bench/results/<date>-compare.json and one SVG chart per
 * workload. `--quick` shortens every workload; `--warm-secs=N` sets how long
 * each steady-rate step runs at its rate before it measures (default 60:
 * an agent is still compiling its path 10-40 s into the rate, which a
 * board's agent, running for days, is long past; docs/benchmarks.md).
 *
 * Durability as measured: keyop `sync: always` (fdatasync before the ack)
 * and `sync: none`; Mosquitto QoS 1 with persistence on (a periodic
 * snapshot, no fsync per message); NATS JetStream on file storage at its
 * default sync (written to the OS on every publish, fsynced every 2 min).
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import mqtt, { type IClientOptions, type MqttClient } from "mqtt";
import { connect as natsConnect, StorageType, type NatsConnection } from "nats";
import { rssOf, anonOf, startAgent, publishRate } from "./api.ts";
import { paced, start, startTrio, stop, streamCount, until, type Proc } from "./fed-lib.ts";
import { diskFloorUs, pace, syscallNs, printTable, quantile, workers, writeResults, type Row } from "./lib.ts";
import { portOpen, spawnReady, stopProc, type Proc as Child } from "./procs.ts";
import { bin, costBetween, cpuOf, ensureInstalled, freePort, Servers, snapshotOf, type ConfServer, type Server } from "./servers.ts";
import { RawHttp } from "./raw-http.ts";
import { scaleOut } from "./scale-out.ts";
import { requestReply } from "./request.ts";
import { queueGroups } from "./queue.ts";
import { shapedLink } from "./shaped.ts";
import { steady } from "./steady.ts";
import { barChart, type Bar } from "./svg.ts";

const quick = process.argv.includes("--quick");
/** `--only=<text>`: run just the steps whose names contain it. */
const only = process.argv.find((a) => a.startsWith("--only="))?.slice("--only=".length);
const SECS = quick ? 2 : 5;
/** Alternating rounds of keyop's MQTT listener and Mosquitto in the ingest figure (issue 10's target). */
const MQTT_ROUNDS = quick ? 1 : 5;
const LAT_SECS = quick ? 3 : 10;
const BACKLOG = quick ? 10_000 : 50_000;
const CRASH = 10_000;
const PAYLOAD = "x".repeat(256);
const root = mkdtempSync(join(process.env.KEYOP_BENCH_DIR ?? tmpdir(), "keyop-compare-"));
const started = new Set<ReturnType<typeof Bun.spawn>>();
const rows: Row[] = [];
/** Ingest rates by what was measured, for the targets: typed, so a renamed label cannot drop one. */
type IngestId = `keyop-http-${"always" | "none"}-${number}` | `keyop-mqtt-${number}` | `mqtt-floor-${number}` | `mosquitto-${number}` | `nats-${number}`;
const ingest = new Map<IngestId, number>();
/** Which system a figure belongs to (chart colour, and the key the targets read). */
type Series = "keyop" | "keyop-none" | "keyop-mqtt" | "floor" | "mosquitto" | "nats";
/** Whose resources were measured. */
type ResourcesOf = "keyop (sync=always)" | "keyop (sync=none)" | "mosquitto" | "nats-server";
const charts: Record<string, Bar[]> = { ingest: [], latency: [], backlog: [], crash: [], resources: [], steady: [] };

// ---------- plumbing ----------

const servers = new Servers(root, started);
const dir = (name: string) => servers.dir(name);
const kill = (s: { proc: Child }, signal: "SIGTERM" | "SIGKILL" = "SIGTERM") => servers.kill(s, signal);
const mosquitto = (name: string, append = "") => servers.mosquitto(name, append);
const natsJs = (name: string) => servers.natsJs(name);

/** `n` concurrent loops calling `fn` until `total` succeeded. */
async function untilCount(n: number, total: number, fn: () => Promise<unknown>): Promise<void> {
  let issued = 0;
  await Promise.all(
    Array.from({ length: n }, async () => {
      while (issued < total) {
        issued++;
        await fn();
      }
    }),
  );
}

/** Waits until `count()` reaches `want`, or stops growing for `idleMs` (then some were lost). */
async function arrivals(count: () => number | Promise<number>, want: number, idleMs: number, maxMs: number): Promise<{ got: number; ms: number }> {
  const t0 = performance.now();
  let last = -1;
  let lastChange = t0;
  while (true) {
    const got = await count();
    const now = performance.now();
    if (got !== last) {
      last = got;
      lastChange = now;
    }
    if (got >= want || now - lastChange > idleMs || now - t0 > maxMs) return { got, ms: (got >= want ? now : lastChange) - t0 };
    await Bun.sleep(10);
  }
}

const stamp = () => ({ t: performance.timeOrigin + performance.now(), pad: "x".repeat(200) });

function row(group: string, metric: string, value: number, unit: string, note?: string): void {
  rows.push({ group, metric, value, unit, note });
}

// ---------- 1 + 5. ingest and resources ----------

/** HTTP publishes from 64 connections: alternating rounds of `sync: always` keyop and the bare sink. */
const HTTP_ROUNDS = quick ? 1 : 3;

/**
 * One round of HTTP publishes with how busy each side was, in % of a core:
 * the server (utime + stime of `pid`) and the client, this process. A
 * server under 100% waits (for its fdatasyncs, or for the client); a client
 * near 100% is the bound itself.
 */
async function boundRound(pid: number, round: () => Promise<{ rate: number; errors: number }>): Promise<{ rate: number; errors: number; busy: string }> {
  const s0 = cpuOf(pid);
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  const r = await round();
  const secs = (performance.now() - t0) / 1000;
  const c = process.cpuUsage(c0);
  const pct = (cpu: number) => Math.round((cpu / secs) * 100);
  return { ...r, busy: `${pct(cpuOf(pid) - s0)} / ${pct((c.user + c.system) / 1e6)}%` };
}

async function ingestHttp(): Promise<void> {
  // The floor of the `always` rows: a bare Bun.serve that answers each POST once a write + fdatasync
  // of its batch is done (bench/http-floor.ts), measured in rounds alternating with keyop's.
  const floorSocket = join(dir("http-floor"), "floor.sock");
  const floor = await spawnReady(
    [process.execPath, join(import.meta.dir, "http-floor.ts"), floorSocket, join(dir("http-floor"), "log")],
    async () => (await fetch("http://floor/", { method: "POST", body: "x", unix: floorSocket } as RequestInit).catch(() => null))?.status === 201,
    "http floor",
    { group: started },
  );
  for (const sync of ["always", "none"]) {
    const a = await startAgent(sync);
    await Bun.sleep(500);
    const idle = rssOf(a.proc.pid);
    const idleAnon = anonOf(a.proc.pid);
    for (const n of [1, 64]) {
      const c0 = cpuOf(a.proc.pid);
      let busy = 0;
      const sampler = setTimeout(() => (busy = rssOf(a.proc.pid)), (SECS * 1000) / 2);
      const rounds = sync === "always" ? HTTP_ROUNDS : 1;
      const keyopRates: number[] = [];
      const floorRates: number[] = [];
      // Which side bounds each round: the server's CPU and the client's (this process), in % of a core.
      const keyopBusy: string[] = [];
      const floorBusy: string[] = [];
      let errors = 0;
      for (let round = 0; round < rounds; round++) {
        const r = await boundRound(a.proc.pid, () => publishRate(a.socket, n, SECS));
        keyopRates.push(r.rate);
        keyopBusy.push(r.busy);
        errors += r.errors;
        if (sync === "always") {
          const f = await boundRound(floor.pid, () => publishRate(floorSocket, n, SECS));
          floorRates.push(f.rate);
          floorBusy.push(f.busy);
        }
      }
      clearTimeout(sampler);
      const r = { rate: quantile([...keyopRates], 0.5), errors };
      const label = `keyop sync=${sync}, ${n} in flight`;
      const roundsNote = rounds > 1 ? `; median of ${rounds} rounds alternating with the bare sink: ${keyopRates.map((x) => Math.round(x)).join(" / ")}` : "";
      row("1 ingest", label, r.rate, "msg/s", `${r.errors ? `${r.errors} errors` : "Unix socket, HTTP"}${roundsNote}; busy (server / client) by round: ${keyopBusy.join(", ")}`);
      if (sync === "always") {
        const f = quantile([...floorRates], 0.5);
        httpFloor[n] = f;
        row(
          "1 ingest",
          `bare Bun HTTP sink (write + fdatasync per batch), ${n} in flight`,
          f,
          "msg/s",
          `Unix socket, HTTP; rounds: ${floorRates.map((x) => Math.round(x)).join(" / ")}; keyop / the sink per round: ${keyopRates.map((x, i) => (x / floorRates[i]!).toFixed(2)).join(" / ")}; busy (server / client) by round: ${floorBusy.join(", ")}`,
        );
      }
      ingest.set(`keyop-http-${sync as "always" | "none"}-${n}`, r.rate);
      charts.ingest!.push({ label, value: r.rate, series: "keyop" });
      if (n === 64) {
        // (The agent idles while the sink's rounds run: its CPU counts against its own messages.)
        const msgs = keyopRates.reduce((sum, x) => sum + x * SECS, 0);
        const cpu = ((cpuOf(a.proc.pid) - c0) / msgs) * 100_000;
        resources(sync === "always" ? "keyop (sync=always)" : "keyop (sync=none)", idle, busy, cpu, `anonymous ${idleAnon.toFixed(1)} MB idle`);
      }
    }
    if (sync === "always") {
      // Not a target, for context: the same agent taking NDJSON batches of 100 on 4 connections.
      const line = JSON.stringify({ type: "t", payload: PAYLOAD });
      const req = RawHttp.request("POST", "/v1/channels/bench.batch/messages", Array(100).fill(line).join("\n") + "\n", "application/x-ndjson");
      const conns = await Promise.all(Array.from({ length: 4 }, () => RawHttp.connect(a.socket)));
      const free = [...conns];
      const rate =
        (await workers(4, SECS, async () => {
          const c = free.pop()!; // one request at a time per connection
          await c.send(req);
          free.push(c);
        })) * 100;
      for (const c of conns) c.close();
      row("1 ingest", "keyop sync=always, NDJSON batches of 100 (context)", rate, "msg/s", "one request carries 100 messages");
    }
    await a.stop();
  }
  await stopProc(floor, "SIGTERM", started);
}

/** The bare Bun HTTP sink's rate, per in-flight count (the `always` rows' floor). */
const httpFloor: Record<number, number> = {};

/** keyop MQTT rate over Mosquitto's, per in-flight count: the median of the per-round ratios. */
const pairedMqtt: Record<number, number> = {};
/** The same for the bare Bun sink (bench/ingest-floor.ts): what the runtime and disk allow. */
const pairedFloor: Record<number, number> = {};

async function ingestMqtt(): Promise<void> {
  // MQTT QoS 1 ingest (issue 10): keyop's listener (sync always) and Mosquitto, the same client
  // and loop, in alternating rounds. This shared machine's speed drifts by a third from one
  // minute to the next; alternating rounds give both the same conditions, and the median of
  // each is what counts.
  const port = freePort();
  const kp = await start(dir("keyop-mqtt"), "mqtt-agent", `mqtt:\n  listen: 127.0.0.1:${port}\n`, "always");
  await until("keyop mqtt listening", portOpen(port), 20_000);
  const mq = await mosquitto("mq-ingest");
  // The floor: a bare Bun sink that acknowledges each publish once a write + fdatasync of its batch
  // is done (bench/ingest-floor.ts), so that both ratios sit beside what this runtime and disk allow.
  const floorPort = freePort();
  const floor = await spawnReady([process.execPath, join(import.meta.dir, "ingest-floor.ts"), String(floorPort), join(dir("mqtt-floor"), "log"), "inline"], portOpen(floorPort), "ingest floor", {
    group: started,
  });
  const sides = [
    {
      who: "keyop",
      id: (n: number): IngestId => `keyop-mqtt-${n}`,
      label: (n: number) => `keyop MQTT QoS 1 (sync=always), ${n} in flight`,
      pid: kp.proc.pid,
      client: await mqtt.connectAsync(`mqtt://127.0.0.1:${port}`, { clean: true, clientId: "bench-keyop-mqtt" }),
      note: "TCP loopback",
    },
    {
      who: "mosquitto",
      id: (n: number): IngestId => `mosquitto-${n}`,
      label: (n: number) => `mosquitto QoS 1, ${n} in flight`,
      pid: mq.proc.pid!,
      client: await mqtt.connectAsync(`mqtt://127.0.0.1:${mq.port}`, { clean: true, clientId: "bench-ingest" }),
      note: "TCP loopback, persistence on",
    },
    {
      who: "floor",
      id: (n: number): IngestId => `mqtt-floor-${n}`,
      label: (n: number) => `bare Bun QoS 1 sink (write + fdatasync per batch), ${n} in flight`,
      pid: floor.pid,
      client: await mqtt.connectAsync(`mqtt://127.0.0.1:${floorPort}`, { clean: true, clientId: "bench-floor" }),
      note: "TCP loopback; every publish of a batch in one write, one fdatasync, then the PUBACKs",
    },
  ];
  const idle = rssOf(mq.proc.pid!);
  // Both warmed up alike first (keyop's JIT, both servers' first allocations), untimed.
  for (const side of sides) await workers(64, 2, () => side.client.publishAsync("bench/in", PAYLOAD, { qos: 1 }));
  for (const n of [1, 64]) {
    const rates: Record<string, number[]> = { keyop: [], mosquitto: [], floor: [] };
    const cpu: Record<string, number> = { keyop: 0, mosquitto: 0, floor: 0 };
    // Of it, a Bun server's thread pool (keyop's zero fill ahead of its records, a commit's
    // fdatasync handed to the pool): work beside the event loop, on the same two cores.
    const poolCpu: Record<string, number> = { keyop: 0, mosquitto: 0, floor: 0 };
    // The client's own CPU (this process): Mosquitto answers at once and is bound by CPU, its
    // own and the client's, while keyop waits for an fdatasync per batch; this shows which.
    const clientCpu: Record<string, number> = { keyop: 0, mosquitto: 0, floor: 0 };
    const msgs: Record<string, number> = { keyop: 0, mosquitto: 0, floor: 0 };
    // The disk's write + fdatasync latency before each round: keyop waits for it, Mosquitto does not.
    const floors: number[] = [];
    // A syscall's price before each round: Mosquitto's rate follows it (see syscallNs).
    const kernel: number[] = [];
    let busy = 0;
    for (let r = 0; r < MQTT_ROUNDS; r++) {
      floors.push(diskFloorUs(dir("keyop-mqtt")));
      kernel.push(syscallNs());
      for (const side of sides) {
        const c0 = snapshotOf([side.pid]);
        const u0 = process.cpuUsage();
        const sampler = side.who === "mosquitto" ? setTimeout(() => (busy = Math.max(busy, rssOf(side.pid))), (SECS * 1000) / 2) : undefined;
        const rate = await workers(n, SECS, () => side.client.publishAsync("bench/in", PAYLOAD, { qos: 1 }));
        clearTimeout(sampler);
        const u = process.cpuUsage(u0);
        clientCpu[side.who]! += (u.user + u.system) / 1e6;
        const cost = costBetween(c0, snapshotOf([side.pid]));
        cpu[side.who]! += cost.cpu;
        poolCpu[side.who]! += cost.byKind.pool ?? 0;
        msgs[side.who]! += rate * SECS;
        rates[side.who]!.push(rate);
      }
    }
    // Each keyop round ran right before its Mosquitto round: the ratio within a round compares the
    // two under the same machine conditions, and its median is the steadiest figure of the lot.
    const paired = rates.keyop!.map((x, r) => x / rates.mosquitto![r]!);
    pairedMqtt[n] = quantile([...paired], 0.5);
    const floorPaired = rates.floor!.map((x, r) => x / rates.mosquitto![r]!);
    pairedFloor[n] = quantile([...floorPaired], 0.5);
    const keyopOfFloor = rates.keyop!.map((x, r) => x / rates.floor![r]!);
    row(
      "1 ingest",
      `bare Bun sink / mosquitto, ${n} in flight, paired by round`,
      pairedFloor[n]!,
      "x",
      `median of the per-round ratios (in round order): ${floorPaired.map((x) => x.toFixed(2)).join(" / ")}; keyop / the sink: ${keyopOfFloor.map((x) => x.toFixed(2)).join(" / ")}`,
    );
    row(
      "1 ingest",
      `keyop MQTT / mosquitto, ${n} in flight, paired by round`,
      pairedMqtt[n]!,
      "x",
      `median of the per-round ratios (in round order): ${paired.map((x) => x.toFixed(2)).join(" / ")}; the disk's write + fdatasync before each round: ${floors.map((f) => f.toFixed(0)).join(" / ")} µs`,
    );
    row(
      "floor",
      `write + fdatasync on this disk, during the MQTT rounds (${n} in flight)`,
      quantile([...floors], 0.5),
      "µs",
      `256 bytes into a preallocated file, 200 times before each round: ${floors.map((f) => f.toFixed(0)).join(" / ")} µs`,
    );
    row(
      "floor",
      `one system call (getppid) on this VM, during the MQTT rounds (${n} in flight)`,
      quantile([...kernel], 0.5),
      "ns",
      `mean of 100,000 before each round: ${kernel.map((k) => k.toFixed(0)).join(" / ")} ns; Mosquitto makes about 12 per message here, keyop and the sink a few per window`,
    );
    for (const side of sides) {
      const rounds = rates[side.who]!.map((x) => Math.round(x)).join(" / ");
      const rate = quantile(rates[side.who]!, 0.5);
      const cpuPer100k = (cpu[side.who]! / msgs[side.who]!) * 100_000;
      const clientBusy = Math.round((clientCpu[side.who]! / (MQTT_ROUNDS * SECS)) * 100);
      const pool = side.who === "mosquitto" ? "" : ` (thread pool ${((poolCpu[side.who]! / msgs[side.who]!) * 100_000).toFixed(2)})`;
      row(
        "1 ingest",
        side.label(n),
        rate,
        "msg/s",
        `${side.note}; median of ${MQTT_ROUNDS} alternating rounds: ${rounds}; server CPU ${cpuPer100k.toFixed(2)} s per 100,000${pool}; client (mqtt.js) busy ~${clientBusy}% of a core`,
      );
      charts.ingest!.push({ label: side.label(n), value: rate, series: side.who });
      ingest.set(side.id(n), rate);
      if (n === 64 && side.who === "mosquitto") resources("mosquitto", idle, busy, cpuPer100k);
    }
  }
  for (const side of sides) await side.client.endAsync();
  await stop(kp);
  await kill(mq);
  await stopProc(floor, "SIGTERM", started);
}

/** A connection to the nats-server on `port` with a JetStream file stream `name` on `subject`. */
async function fileStream(port: number, name: string, subject: string) {
  const nc = await natsConnect({ servers: `127.0.0.1:${port}` });
  await (await nc.jetstreamManager()).streams.add({ name, subjects: [subject], storage: StorageType.File });
  return { nc, js: nc.jetstream() };
}

async function ingestNats(): Promise<void> {
  const ns = await natsJs("nats-ingest");
  const { nc, js } = await fileStream(ns.port, "INGEST", "bench.in");
  const data = new TextEncoder().encode(PAYLOAD);
  const nIdle = rssOf(ns.proc.pid!);
  for (const n of [1, 64]) {
    const c0 = cpuOf(ns.proc.pid!);
    let busy = 0;
    const sampler = setTimeout(() => (busy = rssOf(ns.proc.pid!)), (SECS * 1000) / 2);
    const rate = await workers(n, SECS, () => js.publish("bench.in", data));
    clearTimeout(sampler);
    const label = `NATS JetStream, ${n} in flight`;
    row("1 ingest", label, rate, "msg/s", "TCP loopback, file storage");
    ingest.set(`nats-${n}`, rate);
    charts.ingest!.push({ label, value: rate, series: "nats" });
    if (n === 64) resources("nats-server", nIdle, busy, ((cpuOf(ns.proc.pid!) - c0) / (rate * SECS)) * 100_000);
  }
  await nc.close();
  await kill(ns);
}

const rss: Partial<Record<ResourcesOf, { idle: number; busy: number }>> = {};

function resources(who: ResourcesOf, idle: number, busy: number, cpuPer100k: number, note?: string): void {
  rss[who] = { idle, busy };
  row("5 resources", `${who}: RSS idle / during 64-in-flight ingest`, idle, "MB", `${busy.toFixed(1)} MB during${note ? `; ${note}` : ""}`);
  row("5 resources", `${who}: CPU per 100,000 messages`, cpuPer100k, "s", "server process, 64-in-flight ingest");
  const series = who.startsWith("keyop") ? "keyop" : who.startsWith("mosq") ? "mosquitto" : "nats";
  charts.resources!.push({ label: `${who} RSS during ingest`, value: busy, series });
}

// ---------- 2. two hops ----------

function latencyRows(system: string, series: Series, rate: number, lat: number[], sent: number): void {
  const lost = sent - lat.length;
  row("2 two hops", `${system} @${rate}/s p50`, quantile(lat, 0.5), "ms");
  row("2 two hops", `${system} @${rate}/s p99`, quantile(lat, 0.99), "ms");
  row("2 two hops", `${system} @${rate}/s p99.9`, quantile(lat, 0.999), "ms");
  row("2 two hops", `${system} @${rate}/s max`, quantile(lat, 1), "ms", `${lat.length} received, ${lost} lost`);
  charts.latency!.push({ label: `${system} p99 @${rate}/s`, value: quantile(lat, 0.99), series: series.startsWith("keyop") ? "keyop" : series });
  latencies[`${series}@${rate}`] = { p99: quantile(lat, 0.99), lost };
}

const latencies: Partial<Record<`${Series}@${number}`, { p99: number; lost: number }>> = {};

async function twoHopsKeyop(sync: string): Promise<void> {
  const trio = await startTrio(dir(`keyop-hops-${sync}`), { sync });
  try {
    for (const rate of [1000, 5000]) {
      const channel = `t.lat${rate}`;
      const lat: number[] = [];
      let warm = true;
      const s = streamCount(trio.devB, channel, (m) => !warm && lat.push(performance.timeOrigin + performance.now() - m.payload.t));
      const conns = await Promise.all(Array.from({ length: rate > 1000 ? 32 : 8 }, () => RawHttp.connect(trio.devA.socket)));
      await paced(conns, rate * 2, rate, channel); // warm-up, not measured
      await Bun.sleep(500);
      warm = false;
      const total = rate * LAT_SECS;
      await paced(conns, total, rate, channel);
      await arrivals(() => lat.length, total, 3000, 30_000);
      s.stop();
      for (const c of conns) c.close();
      latencyRows(`keyop sync=${sync}`, sync === "always" ? "keyop" : "keyop-none", rate, lat, total);
    }
  } finally {
    for (const p of [trio.devA, trio.devB, trio.hub]) await stop(p).catch(() => {});
  }
}

async function twoHopsKeyopMqtt(): Promise<void> {
  const ports = { devA: freePort(), devB: freePort() };
  const trio = await startTrio(dir("keyop-hops-mqtt"), { pattern: "bench.>", deviceYaml: (n) => `mqtt:\n  listen: 127.0.0.1:${ports[n]}\n` });
  try {
    await mqttLatency(ports.devA, ports.devB, "keyop MQTT (sync=always)", "keyop-mqtt");
  } finally {
    for (const p of [trio.devA, trio.devB, trio.hub]) await stop(p).catch(() => {});
  }
}

/**
 * End-to-end latency of MQTT QoS 1 from a publisher on `pubPort` to a
 * subscriber on `subPort`, at 1,000 and 5,000 msg/s after 2 s of warm-up
 * (while bridges or links come up); the same loop for keyop and Mosquitto.
 */
async function mqttLatency(pubPort: number, subPort: number, system: string, series: Series): Promise<void> {
  for (const rate of [1000, 5000]) {
    const topic = `bench/lat${series}${rate}`;
    const lat: number[] = [];
    let warm = true;
    const sub = await subscribeMqtt(subPort, topic);
    sub.on("message", (_t, p) => !warm && lat.push(performance.timeOrigin + performance.now() - JSON.parse(p.toString()).t));
    const pub = await mqtt.connectAsync(`mqtt://127.0.0.1:${pubPort}`, { clean: true });
    const send = () => pub.publishAsync(topic, JSON.stringify(stamp()), { qos: 1 });
    await pace(rate, rate * 2, 64, send);
    await Bun.sleep(500);
    warm = false;
    const total = rate * LAT_SECS;
    await pace(rate, total, 64, send);
    await arrivals(() => lat.length, total, 3000, 30_000);
    await pub.endAsync();
    await sub.endAsync();
    latencyRows(system, series, rate, lat, total);
  }
}

async function mosquittoTrio(tag: string): Promise<{ hub: ConfServer; a: Server; b: Server; restartHub: () => Promise<void> }> {
  const t = await servers.mosquittoTrio(tag);
  const result = {
    ...t,
    async restartHub() {
      result.hub = await servers.restart(t.hub, "mosquitto");
    },
  };
  return result;
}

async function subscribeMqtt(port: number, topic: string, opts: IClientOptions = { clean: true }): Promise<MqttClient> {
  const c = await mqtt.connectAsync(`mqtt://127.0.0.1:${port}`, opts);
  await c.subscribeAsync(topic, { qos: 1 });
  return c;
}

async function twoHopsMosquitto(): Promise<void> {
  const t = await mosquittoTrio("mq-hops");
  try {
    await mqttLatency(t.a.port, t.b.port, "mosquitto bridges", "mosquitto");
  } finally {
    for (const s of [t.a, t.b, t.hub]) await kill(s).catch(() => {});
  }
}

async function twoHopsNats(): Promise<void> {
  const t = await servers.natsTrio("nats-hops");
  try {
    for (const rate of [1000, 5000]) {
      const subject = `bench.lat${rate}`;
      const lat: number[] = [];
      let warm = true;
      const subConn: NatsConnection = await natsConnect({ servers: `127.0.0.1:${t.b.port}` });
      subConn.subscribe(subject, { callback: (_e, m) => !warm && lat.push(performance.timeOrigin + performance.now() - JSON.parse(new TextDecoder().decode(m.data)).t) });
      await subConn.flush();
      const pub: NatsConnection = await natsConnect({ servers: `127.0.0.1:${t.a.port}` });
      const enc = new TextEncoder();
      await pace(rate, rate * 2, 64, () => pub.publish(subject, enc.encode(JSON.stringify(stamp()))));
      await pub.flush();
      await Bun.sleep(500);
      warm = false;
      const total = rate * LAT_SECS;
      await pace(rate, total, 64, () => pub.publish(subject, enc.encode(JSON.stringify(stamp()))));
      await pub.flush();
      await arrivals(() => lat.length, total, 3000, 30_000);
      await pub.close();
      await subConn.close();
      latencyRows("NATS leaf nodes", "nats", rate, lat, total);
    }
  } finally {
    for (const s of [t.a, t.b, t.hub]) await kill(s).catch(() => {});
  }
}

// ---------- 3. store and forward ----------

function backlogRow(system: string, series: Series, got: number, ms: number): void {
  const lost = BACKLOG - got;
  row(
    "3 store and forward",
    `${system}: ${BACKLOG.toLocaleString("en-US")} published while the hub was down`,
    got >= BACKLOG ? ms / 1000 : NaN,
    "s",
    `until all were at B after the hub started; ${got.toLocaleString("en-US")} arrived, ${lost.toLocaleString("en-US")} never`,
  );
  charts.backlog!.push({ label: `${system}: arrived at B`, value: got, series });
  backlogs[series] = lost;
}

const backlogs: Partial<Record<Series, number>> = {};

async function backlogKeyop(): Promise<void> {
  const trio = await startTrio(dir("keyop-backlog"));
  let hub: Proc = trio.hub;
  try {
    let got = 0;
    const s = streamCount(trio.devB, "t.backlog", () => got++);
    await stop(hub);
    const line = JSON.stringify({ type: "n", payload: PAYLOAD });
    const pub = await RawHttp.connect(trio.devA.socket);
    const batch = RawHttp.request("POST", "/v1/channels/t.backlog/messages", Array(5000).fill(line).join("\n") + "\n", "application/x-ndjson");
    for (let i = 0; i < BACKLOG; i += 5000) await pub.send(batch);
    pub.close();
    hub = await start(trio.dir, "hub", trio.hubYaml);
    const r = await arrivals(() => got, BACKLOG, 10_000, 120_000);
    s.stop();
    backlogRow("keyop", "keyop", r.got, r.ms);
  } finally {
    for (const p of [trio.devA, trio.devB, hub]) await stop(p).catch(() => {});
  }
}

async function backlogMosquitto(): Promise<void> {
  const t = await mosquittoTrio("mq-backlog");
  try {
    let got = 0;
    const sub = await subscribeMqtt(t.b.port, "bench/backlog");
    sub.on("message", () => got++);
    // Let both bridges connect first, then take the hub away (it saves its persistence file on SIGTERM).
    await Bun.sleep(1500);
    await kill(t.hub);
    const pub = await mqtt.connectAsync(`mqtt://127.0.0.1:${t.a.port}`, { clean: true });
    await untilCount(64, BACKLOG, () => pub.publishAsync("bench/backlog", PAYLOAD, { qos: 1 }));
    await pub.endAsync();
    await t.restartHub();
    const r = await arrivals(() => got, BACKLOG, 10_000, 120_000);
    await sub.endAsync();
    backlogRow("mosquitto bridges", "mosquitto", r.got, r.ms);
  } finally {
    for (const s of [t.a, t.b, t.hub]) await kill(s).catch(() => {});
  }
}

async function backlogNats(): Promise<void> {
  const t = await servers.natsTrio("nats-backlog");
  try {
    let got = 0;
    const subConn = await natsConnect({ servers: `127.0.0.1:${t.b.port}` });
    subConn.subscribe("bench.backlog", { callback: () => got++ });
    await subConn.flush();
    await Bun.sleep(1500);
    await kill(t.hub);
    const pub = await natsConnect({ servers: `127.0.0.1:${t.a.port}` });
    const data = new TextEncoder().encode(PAYLOAD);
    for (let i = 0; i < BACKLOG; i++) pub.publish("bench.backlog", data);
    await pub.flush();
    await pub.close();
    t.hub = await servers.restart(t.hub, "nats-server");
    const r = await arrivals(() => got, BACKLOG, 10_000, 120_000);
    await subConn.close();
    backlogRow("NATS leaf nodes", "nats", r.got, r.ms);
  } finally {
    for (const s of [t.a, t.b, t.hub]) await kill(s).catch(() => {});
  }
}

// ---------- 4. crash ----------

function crashRow(system: string, series: Series, acked: number, present: number, note: string): void {
  const gone = Math.max(0, acked - present);
  row("4 crash", `${system}: acknowledged messages gone after SIGKILL`, gone, "msgs", `${acked.toLocaleString("en-US")} acknowledged, ${present.toLocaleString("en-US")} there after restart; ${note}`);
  charts.crash!.push({ label: `${system}: acknowledged, then gone`, value: gone, series });
  crashes[series] = gone;
}

const crashes: Partial<Record<Series, number>> = {};

async function crashKeyop(): Promise<void> {
  const d = dir("keyop-crash");
  let p = await start(d, "edge", "");
  const ids = new Set<string>();
  const conns = await Promise.all(Array.from({ length: 64 }, () => RawHttp.connect(p.socket)));
  const req = RawHttp.request("POST", "/v1/channels/t.crash/messages", JSON.stringify({ type: "t", payload: PAYLOAD }));
  let issued = 0;
  await Promise.all(
    conns.map(async (c) => {
      while (issued < CRASH) {
        issued++;
        const r = await c.send(req);
        if (r.status === 201) ids.add(JSON.parse(r.body.toString()).id);
      }
    }),
  );
  p.proc.kill("SIGKILL");
  await p.proc.exited;
  for (const c of conns) c.close();
  p = await start(d, "edge", "");
  const present = new Set<string>();
  const from = 1;
  while (true) {
    const r = (await (await fetch(`http://k/v1/channels/t.crash/messages?subscriber=check&from=${from}&max=10000`, { unix: p.socket } as RequestInit)).json()) as {
      messages: { id: string; seq: number }[];
    };
    if (!r.messages?.length) break;
    for (const m of r.messages) present.add(m.id);
    await fetch(`http://k/v1/channels/t.crash/subscribers/check/ack`, {
      method: "POST",
      body: JSON.stringify({ seq: r.messages.at(-1)!.seq }),
      headers: { "content-type": "application/json" },
      unix: p.socket,
    } as RequestInit);
  }
  const kept = [...ids].filter((id) => present.has(id)).length;
  await stop(p);
  crashRow("keyop sync=always", "keyop", ids.size, kept, "each publish answered after fdatasync");
}

async function crashMosquitto(): Promise<void> {
  let mq = await mosquitto("mq-crash");
  // A persistent subscriber that is away: the broker must keep every QoS 1 message for it.
  const away = await subscribeMqtt(mq.port, "bench/crash", { clean: false, clientId: "crash-reader" });
  await away.endAsync();
  const pub = await mqtt.connectAsync(`mqtt://127.0.0.1:${mq.port}`, { clean: true });
  let acked = 0;
  await untilCount(64, CRASH, async () => {
    await pub.publishAsync("bench/crash", PAYLOAD, { qos: 1 });
    acked++;
  });
  await kill(mq, "SIGKILL");
  pub.end(true);
  mq = await servers.restart(mq, "mosquitto");
  let got = 0;
  const back = await mqtt.connectAsync(`mqtt://127.0.0.1:${mq.port}`, { clean: false, clientId: "crash-reader" });
  back.on("message", () => got++);
  await arrivals(() => got, acked, 3000, 30_000);
  await back.endAsync();
  await kill(mq);
  crashRow("mosquitto QoS 1", "mosquitto", acked, got, "PUBACK before the periodic snapshot; counted by the persistent subscriber");
}

async function crashNats(): Promise<void> {
  let ns = await natsJs("nats-crash");
  let { nc, js } = await fileStream(ns.port, "CRASH", "bench.crash");
  const data = new TextEncoder().encode(PAYLOAD);
  let acked = 0;
  await untilCount(64, CRASH, async () => {
    await js.publish("bench.crash", data);
    acked++;
  });
  await kill(ns, "SIGKILL");
  await nc.close().catch(() => {});
  ns = await servers.restart(ns, "nats-server");
  nc = await natsConnect({ servers: `127.0.0.1:${ns.port}` });
  let present = 0;
  await until(
    "stream recovered",
    async () => {
      try {
        present = (await (await nc.jetstreamManager()).streams.info("CRASH")).state.messages;
        return true;
      } catch {
        return false;
      }
    },
    20_000,
  );
  await nc.close();
  await kill(ns);
  crashRow("NATS JetStream", "nats", acked, present, "publish acknowledged by the stream; counted from the stream after restart");
}

// ---------- 6. steady rate ----------

async function steadyRate(): Promise<void> {
  const before = syscallNs();
  const r = await steady({
    servers,
    rates: [100, 1000],
    warmMessages: quick ? 3000 : 60_000,
    warmSecs: quick ? 1 : Number(process.argv.find((a) => a.startsWith("--warm-secs="))?.slice(12) ?? 60),
    secs: quick ? 3 : 10,
    idleSecs: quick ? 5 : 60,
    settleSecs: quick ? 10 : 40,
    only: only?.startsWith("steady") ? only : undefined,
  });
  rows.push(...r.rows);
  const after = syscallNs();
  row(
    "floor",
    "one system call (getppid) on this VM, before / after the steady workload",
    (before + after) / 2,
    "ns",
    `${before.toFixed(0)} / ${after.toFixed(0)} ns, each the mean of 100,000 (the price of a kernel entry moves between sessions with the host)`,
  );
  for (const c of r.costs)
    if (c.rate === 1000)
      charts.steady!.push({
        label: `${c.workload}${c.system === "floor" ? "" : `, ${c.system}`}`,
        value: c.cpuUs,
        series: c.system === "floor" ? "floor" : c.system.startsWith("keyop") ? "keyop" : c.system,
      });
}

// ---------- run ----------

function versions(): Record<string, string> {
  const v = (cmd: string[]) => {
    const r = Bun.spawnSync(cmd, { stdout: "pipe", stderr: "pipe" });
    return (r.stdout.toString() + r.stderr.toString()).trim().split("\n")[0]!;
  };
  return {
    keyop: JSON.parse(readFileSync(join(import.meta.dir, "..", "package.json"), "utf8")).version,
    bun: Bun.version,
    mosquitto: v([bin("mosquitto"), "-h"]).replace(/^mosquitto version /, ""),
    "nats-server": v([bin("nats-server"), "--version"]),
    "mqtt.js": JSON.parse(readFileSync(join(import.meta.dir, "..", "node_modules", "mqtt", "package.json"), "utf8")).version,
    "nats.js": JSON.parse(readFileSync(join(import.meta.dir, "..", "node_modules", "nats", "package.json"), "utf8")).version,
  };
}

function targets(): void {
  const get = (id: IngestId) => ingest.get(id) ?? NaN;
  const k = get("keyop-http-always-64");
  const m = get("mosquitto-64");
  const n = get("nats-64");
  const verdict = (ok: boolean) => (ok ? "met" : "MISSED");
  row(
    "targets",
    "keyop always / mosquitto QoS 1 ingest, 64 in flight",
    k / m,
    "x",
    `>= 1: ${verdict(k >= m)}; the bare Bun HTTP sink with the same fdatasyncs: ${((httpFloor[64] ?? NaN) / m).toFixed(2)}x (not paired with mosquitto's rounds)`,
  );
  row("targets", "keyop always / NATS JetStream ingest, 64 in flight", k / n, "x", `> 1: ${verdict(k > n)}`);
  const km = get("keyop-mqtt-64");
  row("targets", "keyop MQTT QoS 1 (fsyncing) / mosquitto QoS 1, 64 in flight", km / m, "x", `>= 1 (issue 10): ${verdict(km >= m)}; ratio of the medians`);
  const kmp = pairedMqtt[64] ?? NaN;
  row(
    "targets",
    "keyop MQTT QoS 1 (fsyncing) / mosquitto QoS 1, 64 in flight, paired by round",
    kmp,
    "x",
    `>= 1 (issue 10): ${verdict(kmp >= 1)}; median of the per-round ratios; the bare Bun sink with the same fdatasyncs: ${(pairedFloor[64] ?? NaN).toFixed(2)}x`,
  );
  for (const rate of [1000, 5000]) {
    const kp = latencies[`keyop@${rate}`]?.p99 ?? NaN;
    const others = Math.min(latencies[`mosquitto@${rate}`]?.p99 ?? Infinity, latencies[`nats@${rate}`]?.p99 ?? Infinity);
    row("targets", `keyop two-hop p99 @${rate}/s vs the better peer`, kp / others, "x", `<= 1: ${verdict(kp <= others)}`);
  }
  row("targets", "keyop messages lost, store and forward + crash", (backlogs.keyop ?? NaN) + (crashes.keyop ?? NaN), "msgs", `0: ${verdict(backlogs.keyop === 0 && crashes.keyop === 0)}`);
  const kr = rss["keyop (sync=always)"]?.busy ?? NaN;
  const nr = rss["nats-server"]?.busy ?? NaN;
  row("targets", "keyop RSS / nats-server RSS during ingest", kr / nr, "x", `<= 3: ${verdict(kr <= 3 * nr)}`);
}

const t0 = performance.now();
try {
  ensureInstalled({ mosquitto: "mosquitto", "nats-server": "nats-server", strace: "strace" });
  const v = versions();
  console.log(
    `keyop compare${quick ? " (quick)" : ""}: ${Object.entries(v)
      .map(([k, x]) => `${k} ${x}`)
      .join(", ")}`,
  );
  const steps: [string, () => Promise<void>][] = [
    ["1+5 ingest: keyop HTTP", ingestHttp],
    ["1+5 ingest: mqtt, keyop and mosquitto alternating", ingestMqtt],
    ["1+5 ingest: nats", ingestNats],
    ["2 two hops: keyop sync=always", () => twoHopsKeyop("always")],
    ["2 two hops: keyop sync=none", () => twoHopsKeyop("none")],
    ["2 two hops: keyop MQTT", twoHopsKeyopMqtt],
    ["2 two hops: mosquitto", twoHopsMosquitto],
    ["2 two hops: nats", twoHopsNats],
    ["3 store and forward: keyop", backlogKeyop],
    ["3 store and forward: mosquitto", backlogMosquitto],
    ["3 store and forward: nats", backlogNats],
    ["4 crash: keyop", crashKeyop],
    ["4 crash: mosquitto", crashMosquitto],
    ["4 crash: nats", crashNats],
    ["6 steady rate", steadyRate],
    ["7 scale-out: hub tier on JetStream", async () => void rows.push(...(await scaleOut({ root, quick, started })))],
    ["8 shaped link", async () => void rows.push(...(await shapedLink({ servers, quick, only: only?.startsWith("shaped") ? only : undefined })))],
    ["9 request/reply", async () => void rows.push(...(await requestReply({ servers, quick })))],
    ["10 queue group", async () => void rows.push(...(await queueGroups({ servers, quick })))],
  ];
  for (const [name, fn] of steps) {
    if (only && !name.includes(only) && !(name === "6 steady rate" && only.startsWith("steady")) && !(name === "8 shaped link" && only.startsWith("shaped"))) continue;
    const s = performance.now();
    Bun.spawnSync(["sync"]);
    await fn();
    console.log(`  ${name}: ${((performance.now() - s) / 1000).toFixed(1)} s`);
  }
  targets();
  // (A target whose figures were not measured in this run, with --only, is left out.)
  for (let i = rows.length - 1; i >= 0; i--) if (rows[i]!.group === "targets" && !Number.isFinite(rows[i]!.value)) rows.splice(i, 1);
  printTable(`keyop vs Mosquitto and NATS${quick ? " (quick)" : ""}`, rows);
  const path = writeResults(quick ? "compare-quick" : only ? "compare-partial" : "compare", rows, { versions: v, seconds: (performance.now() - t0) / 1000 });
  const base = path.replace(/\.json$/, "");
  const titles: Record<string, [string, string]> = {
    ingest: ["1. Ingest, 256-byte messages (higher is better)", "msg/s"],
    latency: ["2. Two hops A -> hub -> B, p99 latency (lower is better)", "ms"],
    backlog: [`3. Store and forward: of ${BACKLOG.toLocaleString("en-US")} published while the hub was down, arrived at B`, "msgs"],
    crash: [`4. Crash: of ${CRASH.toLocaleString("en-US")} acknowledged, gone after SIGKILL (lower is better)`, "msgs"],
    resources: ["5. RSS during ingest (lower is better)", "MB"],
    steady: ["6. CPU per message at 1,000 msg/s, MQTT QoS 1 (lower is better)", "µs"],
  };
  for (const [k, bars] of Object.entries(charts)) if (bars.length > 0) writeFileSync(`${base}-${k}.svg`, barChart(titles[k]![0], titles[k]![1], bars));
  console.log(`\nresults: ${path} (+ ${Object.keys(charts).length} SVG charts), ${((performance.now() - t0) / 1000).toFixed(0)} s`);
} finally {
  for (const p of started) {
    p.kill("SIGKILL");
    await p.exited;
  }
  rmSync(root, { recursive: true, force: true });
}
