/**
 * Step 7 of `npm run bench:compare`: a hub tier on a 3-node JetStream
 * cluster (R3 streams) on loopback.
 *
 * - Ingest: a board's backlog drained board -> hub -> JetStream, beside a
 *   bare nats.js client publishing the same envelopes with ids to the same
 *   stream (the best of 256, 1,024 and 4,096 publishes in flight), in
 *   alternating rounds; the hub's CPU
 *   per message.
 * - Two hubs: two boards, one per hub, draining at once.
 * - Fleet: simulated boards (real mTLS sessions, bench/sim-boards.ts) over
 *   two hubs: connect, each sends 10 records up, each gets one command
 *   down; the RSS of hubs and nats-servers (one ordered consumer per board
 *   on the command stream) and their idle CPU with the fleet connected.
 *
 * Everything shares two cores: the board agent, the hubs, three
 * nats-servers and this process (the bare client, the simulated fleet).
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { headers } from "nats";
import { encodeEnvelope } from "../src/envelope/envelope.ts";
import { NatsCluster } from "../test/jetstream/nats-cluster.ts";
import { rssOf } from "./api.ts";
import { type Proc, start, status, stop, until } from "./fed-lib.ts";
import { quantile, type Row } from "./lib.ts";
import { cpuOf, freePort } from "./servers.ts";
import { fleetCerts, SimBoard } from "./sim-boards.ts";

export interface ScaleOutOptions {
  root: string;
  quick: boolean;
  /** Every process started, killed by the harness at the end whatever happens. */
  started: Set<ReturnType<typeof Bun.spawn>>;
}

const STREAM = "TELEMETRY";

export async function scaleOut(o: ScaleOutOptions): Promise<Row[]> {
  const rows: Row[] = [];
  const say = (what: string) => console.log(`  scale-out: ${what}`);
  const row = (metric: string, value: number, unit: string, note?: string) => rows.push({ group: "7 scale-out", metric, value, unit, note });
  const N = o.quick ? 5000 : 20_000;
  const ROUNDS = o.quick ? 1 : 5;
  const FLEET = o.quick ? 200 : 1000;
  const dir = join(o.root, "scale-out");
  const pki = join(dir, "pki");
  mkdirSync(pki, { recursive: true });
  await fleetCerts(pki, FLEET);
  const cluster = await NatsCluster.start(join(dir, "nats"), 3, (p) => o.started.add(p));
  const nc = await cluster.client();
  const jsm = await nc.jetstreamManager();
  const agents: Proc[] = [];
  const tls = (n: string) => `tls:\n  cert: ${pki}/${n}.crt\n  key: ${pki}/${n}.key\n  ca: ${pki}/ca.crt\n`;
  const hubPorts = [freePort(), freePort()];
  const peers = Array.from({ length: FLEET }, (_, i) => `    - {name: board-${i}, publish: ["telemetry.>"], subscribe: ["cmd.board-${i}.>"]}`).join("\n");
  const hubYaml = (i: number) =>
    tls("hub") +
    `hub:\n  listen: 127.0.0.1:${hubPorts[i]}\n  peers:\n${peers}\n  jetstream:\n    servers: [${cluster.servers.map((s) => `"${s}"`).join(", ")}]\n` +
    `    streams:\n      - {name: ${STREAM}, channels: ["telemetry.>"], replicas: 3}\n      - {name: CMD, channels: ["cmd.>"], replicas: 3}\n    duplicate_window: 2m\n`;
  const startHub = async (i: number) => {
    const h = await start(dir, `hub${i}`, hubYaml(i), "none");
    agents.push(h);
    await until("jetstream available at the hub", async () => (await status(h)).jetstream?.state === "available");
    return h;
  };
  /** Board `i` as an agent: linked to hub `hubIndex` (from its earliest record), or with no link (null) to take a backlog. */
  const board = async (i: number, hubIndex: number | null) => {
    const link = hubIndex === null ? "" : `links:\n  - hub: 127.0.0.1:${hubPorts[hubIndex]}\n    publish: ["telemetry.>"]\n    subscribe: []\n    start: earliest\n`;
    const b = await start(dir, `board-${i}`, tls(`board-${i}`) + `federation:\n  reconnect_base_ms: 50ms\n  reconnect_max_ms: 100ms\n${link}`, "none");
    agents.push(b);
    return b;
  };
  /** Board `i` takes a backlog of `n` with no link, then starts again linked to hub `hubIndex`. */
  const backlogThenLink = async (i: number, n: number, hubIndex: number) => {
    const alone = await board(i, null);
    await preload(alone, n);
    await stop(alone);
    return board(i, hubIndex);
  };
  /** Publishes `n` 256-byte messages to the board's log, 1,000 per request. */
  const preload = async (b: Proc, n: number) => {
    for (let k = 0; k < n; k += 1000) {
      const body = Array.from({ length: Math.min(1000, n - k) }, (_, i) => JSON.stringify({ type: "n", payload: { i: k + i, pad: "x".repeat(200) } })).join("\n");
      const r = await fetch("http://k/v1/channels/telemetry.bench/messages", { method: "POST", body, headers: { "content-type": "application/x-ndjson" }, unix: b.socket } as RequestInit);
      if (r.status !== 201 && r.status !== 200) throw new Error(`preload: ${r.status} ${await r.text()}`);
    }
  };
  const stored = async () => (await jsm.streams.info(STREAM)).state.messages;
  /**
   * Starts `go` (boards that send their backlog) and times the stream from
   * its first new record to `want` more; `pids`' CPU over the same span
   * (from just before `go`: the hubs are idle until the first record).
   */
  const drain = async (want: number, pids: number[], go: () => Promise<unknown>) => {
    const base = await stored();
    const nats = cluster.nodes.map((n) => n.proc!.pid);
    const c0 = pids.reduce((a, p) => a + cpuOf(p), 0);
    const n0 = nats.reduce((a, p) => a + cpuOf(p), 0);
    const started = go();
    while ((await stored()) === base) await Bun.sleep(2);
    const t1 = performance.now();
    await until("the backlog is in the stream", async () => (await stored()) >= base + want, 300_000);
    const secs = (performance.now() - t1) / 1000;
    const cpu = pids.reduce((a, p) => a + cpuOf(p), 0) - c0;
    const natsCpu = nats.reduce((a, p) => a + cpuOf(p), 0) - n0;
    return { rate: want / secs, cpuUsPerMsg: (cpu / want) * 1e6, natsUsPerMsg: (natsCpu / want) * 1e6, boards: await started };
  };

  try {
    const h0 = await startHub(0);
    const h1 = await startHub(1);
    const h = h0;
    // ---- fleet: simulated boards over two hubs ----
    // First, on a fresh cluster: what the sessions cost is then not hidden in what ingest left behind.
    await Bun.sleep(3000);
    const natsPids = () => cluster.nodes.map((n) => n.proc!.pid);
    const natsRss0 = natsPids().reduce((a, p) => a + rssOf(p), 0);
    const hubRss0 = [h0, h1].reduce((a, h) => a + rssOf(h.proc.pid), 0);
    const t0 = performance.now();
    const fleet: SimBoard[] = [];
    for (let k = 0; k < FLEET; k += 50) {
      const batch = await Promise.all(
        Array.from({ length: Math.min(50, FLEET - k) }, (_, j) => {
          const i = k + j;
          return SimBoard.connect(pki, `board-${i}`, hubPorts[i % 2]!, { publish: ["telemetry.>"], subscribe: [`cmd.board-${i}.>`] });
        }),
      );
      fleet.push(...batch);
    }
    const connectSecs = (performance.now() - t0) / 1000;
    say(`${FLEET} boards connected in ${connectSecs.toFixed(1)} s`);
    await Bun.sleep(2000); // the consumers of the last sessions settle
    const natsRss1 = natsPids().reduce((a, p) => a + rssOf(p), 0);
    const hubRss1 = [h0, h1].reduce((a, h) => a + rssOf(h.proc.pid), 0);
    row(`fleet: ${FLEET} boards connect to two hubs`, connectSecs, "s", "50 at a time, each with its own certificate, over mutual TLS");
    row(
      `fleet: nats-servers' RSS with ${FLEET} boards connected`,
      natsRss1 - natsRss0,
      "MB",
      `all three nodes, +${(((natsRss1 - natsRss0) / FLEET) * 1024).toFixed(0)} KB per board; ${natsRss1.toFixed(0)} MB in all`,
    );
    row(`fleet: hubs' RSS with ${FLEET} boards connected`, hubRss1 - hubRss0, "MB", `both hubs, +${(((hubRss1 - hubRss0) / FLEET) * 1024).toFixed(0)} KB per board; ${hubRss1.toFixed(0)} MB in all`);
    const idle0 = [...natsPids(), h0.proc.pid, h1.proc.pid].map(cpuOf);
    await Bun.sleep(o.quick ? 3000 : 10_000);
    const idleSecs = o.quick ? 3 : 10;
    const idle1 = [...natsPids(), h0.proc.pid, h1.proc.pid].map(cpuOf);
    const idlePct = (from: number, to: number) => ((idle1.slice(from, to).reduce((a, x) => a + x, 0) - idle0.slice(from, to).reduce((a, x) => a + x, 0)) / idleSecs) * 100;
    row(`fleet: idle CPU with ${FLEET} boards connected`, idlePct(0, 5), "% core", `hubs ${idlePct(3, 5).toFixed(1)}%, nats-servers ${idlePct(0, 3).toFixed(1)}%`);
    const u0 = performance.now();
    for (const b of fleet) b.send("telemetry.fleet", 10, { pad: "x".repeat(200) });
    await until("every board's records acknowledged", async () => fleet.every((b) => b.acked >= 10), 120_000);
    const upSecs = (performance.now() - u0) / 1000;
    row(`fleet: ${FLEET} boards send 10 records each`, (FLEET * 10) / upSecs, "msg/s", `all acknowledged (stored in JetStream R3) in ${upSecs.toFixed(2)} s`);
    const d0 = performance.now();
    const js = nc.jetstream();
    await Promise.all(
      fleet.map((b) => {
        const h = headers();
        h.set("Keyop-Type", "cmd");
        return js.publish(`kp.cmd.${b.name}.ping`, JSON.stringify({ at: Date.now() }), { headers: h });
      }),
    );
    await until("every board got its command", async () => fleet.every((b) => b.received >= 1), 120_000);
    row(`fleet: one command to each of ${FLEET} boards, published to JetStream`, (performance.now() - d0) / 1000, "s", "until every board had its own");
    const countConsumers = async () => (await jsm.streams.info("CMD")).state.consumer_count;
    const consumers = await countConsumers();
    row(
      `fleet: consumers on the command stream with ${FLEET} boards connected`,
      consumers,
      "",
      "caught-up boards read their hub's live feed (one ordered consumer per stream per hub); a board gets one of its own only while it is behind",
    );
    for (const b of fleet) b.close();
    // ---- ingest: the hub path beside a bare client, alternating rounds ----
    const bodies = Array.from({ length: N }, (_, i) =>
      encodeEnvelope({ id: Bun.randomUUIDv7(), ts: Date.now(), channel: "telemetry.bare", origin: "bare", type: "n", route: ["bare"], payload: { i, pad: "x".repeat(200) } }),
    );
    const hubRates: number[] = [];
    const bareRates: number[] = [];
    const ratios: number[] = [];
    const hubCpu: number[] = [];
    const clientCpu: number[] = [];
    const bareNatsCpu: number[] = [];
    const hubNatsCpu: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      // Bare nats.js: the same envelopes with fresh ids, at the best of three depths of publishes in
      // flight (the hub has whole batches in flight, thousands of records).
      const js = nc.jetstream();
      let bare = 0;
      let bareCpu = 0;
      let bestDepth = 0;
      let bareNats = 0;
      for (const depth of [256, 1024, 4096]) {
        const ids = bodies.map(() => Bun.randomUUIDv7());
        const nats = cluster.nodes.map((n) => n.proc!.pid);
        const n0 = nats.reduce((a, p) => a + cpuOf(p), 0);
        const u0 = process.cpuUsage();
        const t0 = performance.now();
        let next = 0;
        await Promise.all(
          Array.from({ length: depth }, async () => {
            while (next < N) {
              const i = next++;
              await js.publish("kp.telemetry.bare", bodies[i]!, { msgID: ids[i]! });
            }
          }),
        );
        const rate = N / ((performance.now() - t0) / 1000);
        const u = process.cpuUsage(u0);
        if (rate > bare) {
          bare = rate;
          bareCpu = (u.user + u.system) / N;
          bareNats = ((nats.reduce((a, p) => a + cpuOf(p), 0) - n0) / N) * 1e6;
          bestDepth = depth;
        }
      }
      say(`round ${r + 1}: bare client ${bare.toFixed(0)} msg/s (${bestDepth} in flight)`);
      clientCpu.push(bareCpu);
      bareNatsCpu.push(bareNats);
      bareRates.push(bare);
      // The hub path: a board's backlog of N, taken while it had no link, drained through the running hub.
      const d = await drain(N, [h.proc.pid], () => backlogThenLink(0, N, 0));
      const b0 = d.boards as Proc;
      await until("the board's backlog is acknowledged", async () => ((await status(b0)).links[0]?.backlog ?? []).every((x: { messages: number }) => x.messages === 0));
      await stop(b0);
      say(`round ${r + 1}: hub path ${d.rate.toFixed(0)} msg/s`);
      hubRates.push(d.rate);
      hubCpu.push(d.cpuUsPerMsg);
      hubNatsCpu.push(d.natsUsPerMsg);
      ratios.push(d.rate / bare);
    }
    const med = (xs: number[]) => quantile(xs, 0.5);
    row(
      "ingest board -> hub -> JetStream R3",
      med(hubRates),
      "msg/s",
      `rounds ${hubRates.map((x) => x.toFixed(0)).join(" / ")}; one board's backlog of ${N.toLocaleString("en-US")}, 256-byte payloads; nats-servers' CPU ${med(hubNatsCpu).toFixed(0)} µs per message`,
    );
    row(
      "ingest bare nats.js client -> JetStream R3",
      med(bareRates),
      "msg/s",
      `rounds ${bareRates.map((x) => x.toFixed(0)).join(" / ")}; the best of 256 / 1,024 / 4,096 publishes in flight, ids; client CPU ${med(clientCpu).toFixed(0)} µs, nats-servers' ${med(bareNatsCpu).toFixed(0)} µs per message`,
    );
    row("hub path / bare client, paired by round", med(ratios), "x", `>= 0.8: ${med(ratios) >= 0.8 ? "met" : "MISSED"}; per round ${ratios.map((x) => x.toFixed(2)).join(" / ")}`);
    row("hub CPU per message stored in JetStream", med(hubCpu), "µs", "utime + stime of the hub over the drain (the board agent and three nats-servers share the 2 cores)");

    // ---- two hubs sharing the load ----
    const two = await drain(N, [h0.proc.pid, h1.proc.pid], () => Promise.all([backlogThenLink(0, N / 2, 0), backlogThenLink(1, N / 2, 1)]));
    say(`two hubs: ${two.rate.toFixed(0)} msg/s`);
    row(
      "ingest with two hubs, one board each",
      two.rate,
      "msg/s",
      `${(two.rate / med(hubRates)).toFixed(2)}x one hub; hubs' CPU ${two.cpuUsPerMsg.toFixed(0)} µs per message; both boards, both hubs and three nats-servers on 2 cores`,
    );
    for (const b of two.boards as Proc[]) await stop(b);
  } finally {
    for (const a of agents) await stop(a).catch(() => {});
    await nc.close().catch(() => {});
    await cluster.stop();
  }
  return rows;
}
