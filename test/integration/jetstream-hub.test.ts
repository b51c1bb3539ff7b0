/**
 * A hub tier on a real 3-node JetStream cluster: two keyop hubs with one
 * identity (CN "hub", each its own key), a board linked to both, records
 * stored in an R3 stream exactly once through hub kills, a stream leader
 * kill, and the whole cluster going away and coming back.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { NatsConnection } from "nats";
import { decodeEnvelope } from "../../src/envelope/envelope.ts";
import { freePort, tmpDir, waitFor } from "../helpers.ts";
import { NatsCluster } from "../jetstream/nats-cluster.ts";
import { cli, fleet, runAgent, type AgentProc } from "./agent-process.ts";

const STREAM = "TELEMETRY";
let dir: string;
let cluster: NatsCluster;
let nc: NatsConnection;
let tls: (name: string) => string;
const hubPorts = [freePort(), freePort()];
const hubs: (AgentProc | null)[] = [null, null];
let board: AgentProc;
let boardConfig: string;

async function api(a: AgentProc, method: string, path: string, body?: unknown): Promise<any> {
  const r = await fetch(`http://k${path}`, {
    method,
    body: body === undefined ? undefined : JSON.stringify(body),
    headers: { "content-type": "application/json" },
    unix: a.socket,
  } as RequestInit);
  return r.json();
}

/** Publishes `n` messages to the board in one NDJSON batch; returns their ids. */
async function publish(channel: string, n: number, from = 0): Promise<string[]> {
  const body = Array.from({ length: n }, (_, i) => JSON.stringify({ type: "n", payload: from + i })).join("\n");
  const r = (await fetch(`http://k/v1/channels/${channel}/messages`, { method: "POST", body, headers: { "content-type": "application/x-ndjson" }, unix: board.socket } as RequestInit).then((x) =>
    x.json(),
  )) as { results: { id: string }[] };
  return r.results.map((x) => x.id);
}

/** `fn`, tried again for a while: the test's own client sees the leader elections it causes. */
async function retrying<T>(fn: () => Promise<T>, ms = 30_000): Promise<T> {
  const end = performance.now() + ms;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (performance.now() > end) throw err;
      await Bun.sleep(200);
    }
  }
}

/**
 * Every record of `channel` in the stream, in stream order (its id and route
 * from the stored envelope, and its subject): one STREAM.MSG.GET with
 * next_by_subj per record, each with its own timeout, so a leader election
 * costs a retry and cannot hang the read.
 */
async function streamRecords(channel: string): Promise<{ id: string; channel: string; subject: string; route: string[] }[]> {
  // (Asks the cluster for account info: during a leader election that can time out, so retried too.)
  const jsm = await retrying(() => nc.jetstreamManager());
  const subject = `kp.${channel}`;
  const out: { id: string; channel: string; subject: string; route: string[] }[] = [];
  let seq = 1;
  for (;;) {
    const m = await retrying(async () => {
      try {
        return await jsm.streams.getMessage(STREAM, { seq, next_by_subj: subject } as unknown as { seq: number });
      } catch (err) {
        if (/no message found/i.test(String(err))) return null;
        throw err;
      }
    });
    if (m === null) return out;
    const e = decodeEnvelope(m.data, 0);
    out.push({ id: e.id, channel: e.channel, subject: m.subject, route: e.route });
    seq = m.seq + 1;
  }
}

/** Reads `channel` on the board from the start, acknowledging as it goes, until `n` messages are in. */
async function collect(a: AgentProc, channel: string, sub: string, n: number, timeoutMs: number): Promise<any[]> {
  const got: any[] = [];
  await waitFor(
    async () => {
      const r = await api(a, "GET", `/v1/channels/${channel}/messages?subscriber=${sub}&from=earliest&max=10000&wait=500`);
      if (r.messages?.length) {
        got.push(...r.messages);
        await api(a, "POST", `/v1/channels/${channel}/subscribers/${sub}/ack`, { seq: r.messages.at(-1).seq });
      }
      return got.length >= n;
    },
    `${n} messages of ${channel}`,
    timeoutMs,
  );
  return got;
}

async function streamCount(): Promise<number> {
  return retrying(async () => (await (await nc.jetstreamManager()).streams.info(STREAM)).state.messages);
}

function hubYaml(i: number): string {
  return [
    tls(i === 0 ? "hub" : "hub2/hub"),
    "federation:\n  heartbeat_ms: 500ms\n  reconnect_base_ms: 100ms\n  reconnect_max_ms: 500ms\n",
    `audit:\n  path: ${join(dir, `hub${i}-audit.log`)}\n`,
    `hub:\n  listen: 127.0.0.1:${hubPorts[i]}\n  peers:\n    - name: board\n      publish: ["t.>"]\n      subscribe: [{pattern: "cmd.board.>", priority: 0}, "small.board.>"]\n`,
    "  jetstream:\n",
    `    servers: [${cluster.servers.map((s) => `"${s}"`).join(", ")}]\n`,
    "    subject_prefix: kp\n",
    `    streams:\n      - {name: ${STREAM}, channels: ["t.>"], replicas: 3}\n      - {name: CMD, channels: ["cmd.>"], replicas: 3}\n      - {name: SMALL, channels: ["small.>"], replicas: 3, max_bytes: 8KiB}\n`,
    "    duplicate_window: 2m\n",
  ].join("");
}

async function startHub(i: number): Promise<AgentProc> {
  const f = join(dir, `hub${i}.yaml`);
  writeFileSync(f, hubYaml(i));
  const a = await runAgent(join(dir, `hub${i}`), ["--config", f]);
  hubs[i] = a;
  await waitFor(async () => (await api(a, "GET", "/v1/status")).jetstream?.state === "available", `hub ${i} sees jetstream`, 30_000, 100);
  return a;
}

async function stopHub(i: number, signal: "SIGKILL" | "SIGTERM"): Promise<void> {
  const h = hubs[i];
  if (!h) return;
  h.child.proc.kill(signal);
  await h.child.proc.exited;
  hubs[i] = null;
}

/** Waits until the board's link has nothing unacknowledged on `channel`. */
async function drained(channel: string, timeoutMs = 60_000): Promise<void> {
  await waitFor(
    async () => {
      const l = (await api(board, "GET", "/v1/status")).links[0];
      const b = l?.backlog?.find((x: { channel: string }) => x.channel === channel);
      return l?.state === "open" && b !== undefined && b.messages === 0;
    },
    `board's backlog of ${channel} drained`,
    timeoutMs,
    50,
  );
}

beforeAll(async () => {
  dir = tmpDir();
  cluster = await NatsCluster.start(join(dir, "nats"));
  nc = await cluster.client();
  tls = await fleet(dir, ["hub", "board"]);
  // The second hub of the tier: the same name (CN), its own key.
  mkdirSync(join(dir, "pki", "hub2"), { recursive: true });
  const r = await cli(["cert", "issue", "--name", "hub", "--ca-dir", join(dir, "pki"), "--out-dir", join(dir, "pki", "hub2"), "--ip", "127.0.0.1"]);
  if (r.code !== 0) throw new Error(`second hub certificate: ${r.err}`);
  await startHub(0);
  await startHub(1);
  const f = join(dir, "board.yaml");
  writeFileSync(
    f,
    tls("board") +
      "federation:\n  heartbeat_ms: 500ms\n  reconnect_base_ms: 100ms\n  reconnect_max_ms: 500ms\n" +
      `links:\n  - hub: ["127.0.0.1:${hubPorts[0]}", "127.0.0.1:${hubPorts[1]}"]\n    publish: ["t.>"]\n    subscribe: ["cmd.board.>", "small.board.>"]\n    start: earliest\n`,
  );
  board = await runAgent(join(dir, "board"), ["--config", f]);
  boardConfig = f;
}, 90_000);

afterAll(async () => {
  for (const a of [board, ...hubs]) {
    if (!a) continue;
    a.child.proc.kill("SIGKILL");
    await a.child.proc.exited;
  }
  await nc?.close().catch(() => {});
  await cluster?.stop();
});

describe("hub tier on JetStream", () => {
  test("the hubs provision the stream as configured: R3, the subjects under the prefix, the duplicate window", async () => {
    const jsm = await retrying(() => nc.jetstreamManager());
    const info = await jsm.streams.info(STREAM);
    expect(info.config.subjects).toEqual(["kp.t.>"]);
    expect(info.config.num_replicas).toBe(3);
    expect(info.config.duplicate_window).toBe(120_000_000_000);
    expect(info.cluster?.replicas?.length).toBe(2);
    const metrics = await (await fetch("http://k/metrics", { unix: hubs[0]!.socket } as RequestInit)).text();
    expect(metrics).toContain("keyop_jetstream_available 1");
  });

  test("a peer rule no stream covers: keyop run refuses to start, exit 2, naming the pattern", async () => {
    const f = join(dir, "bad-hub.yaml");
    writeFileSync(f, hubYaml(0).replace('publish: ["t.>"]', 'publish: ["t.>", "logs.>"]'));
    const r = await cli(["run", "--config", f, "--data-dir", join(dir, "bad-hub"), "--socket", join(dir, "bad-hub.sock")]);
    expect(r.code).toBe(2);
    expect(r.err).toContain('hub.peers[0].publish: "logs.>" of peer board is not covered by any one stream of hub.jetstream.streams');
  });

  test("records from a board are stored in the stream once each, subject = prefix + channel, the hub in their route", async () => {
    const ids = await publish("t.up", 500);
    await drained("t.up");
    const recs = await streamRecords("t.up");
    expect(recs.map((r) => r.id)).toEqual(ids);
    expect(new Set(recs.map((r) => r.subject))).toEqual(new Set(["kp.t.up"]));
    expect(recs[0]!.route).toEqual(["board", "hub"]);
  }, 60_000);

  test("a hub SIGKILLed mid-transfer: the board fails over to the other hub, resends, and the stream holds each record once", async () => {
    const before = await streamCount();
    const serving = (await api(board, "GET", "/v1/status")).links[0].target as string;
    const i = serving.endsWith(`:${hubPorts[0]}`) ? 0 : 1;
    const ids: string[] = [];
    for (let b = 0; b < 5; b++) ids.push(...(await publish("t.failover", 2000, b * 2000)));
    // Kill the serving hub while the backlog is in flight.
    await waitFor(async () => (await streamCount()) > before, "some records stored before the kill", 30_000, 5);
    await stopHub(i, "SIGKILL");
    await drained("t.failover", 90_000);
    const link = (await api(board, "GET", "/v1/status")).links[0];
    expect(link.target).toBe(`127.0.0.1:${hubPorts[1 - i]}`);
    // The resend reached JetStream twice for what the killed hub had stored: dropped there by id.
    expect((await api(hubs[1 - i]!, "GET", "/v1/status")).jetstream.duplicates).toBeGreaterThan(0);
    const recs = await streamRecords("t.failover");
    expect(recs.length).toBe(ids.length);
    expect(new Set(recs.map((r) => r.id))).toEqual(new Set(ids));
    await startHub(i);
  }, 120_000);

  test("the stream leader SIGKILLed during a transfer: the hub resends with the same ids, nothing lost, nothing twice", async () => {
    const jsm = await retrying(() => nc.jetstreamManager());
    const leader = await retrying(async () => (await jsm.streams.info(STREAM)).cluster!.leader!);
    const before = await streamCount();
    const ids: string[] = [];
    for (let b = 0; b < 5; b++) ids.push(...(await publish("t.leader", 2000, b * 2000)));
    await waitFor(async () => (await streamCount()) > before, "some records stored before the kill", 30_000, 5);
    await cluster.stopNode(leader, "SIGKILL");
    try {
      await drained("t.leader", 90_000);
      const recs = await streamRecords("t.leader");
      expect(recs.length).toBe(ids.length);
      expect(new Set(recs.map((r) => r.id))).toEqual(new Set(ids));
      // The kill was felt: publishes were sent again with their ids.
      const retries = await Promise.all(hubs.map(async (h) => (await api(h!, "GET", "/v1/status")).jetstream.retries as number));
      expect(retries.reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
    } finally {
      // Whatever happened, the next tests get the whole cluster back.
      cluster.startNode(leader);
      await cluster.waitReady();
    }
  }, 150_000);

  test("commands published by a NATS client reach the board; it moves to the other hub mid-flow: all arrive, in order, none twice", async () => {
    const js = nc.jetstream();
    const { headers } = await import("nats");
    const send = async (from: number, n: number) => {
      for (let i = from; i < from + n; i++) {
        const h = headers();
        h.set("Keyop-Type", "cmd");
        h.set("Keyop-Origin", "ops");
        await js.publish("kp.cmd.board.run", JSON.stringify({ n: i }), { headers: h });
      }
    };
    await send(0, 300);
    const first = await collect(board, "cmd.board.run", "c", 100, 30_000);
    expect(first[0]).toMatchObject({ type: "cmd", origin: "ops", payload: { n: 0 }, route: ["hub", "board"] });
    const serving = (await api(board, "GET", "/v1/status")).links[0].target as string;
    const i = serving.endsWith(`:${hubPorts[0]}`) ? 0 : 1;
    await stopHub(i, "SIGKILL");
    await send(300, 300);
    const rest = await collect(board, "cmd.board.run", "c", 600 - first.length, 60_000);
    const all = [...first, ...rest];
    expect(all.map((m) => m.payload.n)).toEqual(Array.from({ length: 600 }, (_, k) => k));
    expect(new Set(all.map((m) => m.id)).size).toBe(600);
    expect((await api(board, "GET", "/v1/status")).links[0].target).toBe(`127.0.0.1:${hubPorts[1 - i]}`);
    // The tier's sender takes the peer's lanes and the codec the session agreed on, as a hub's own does.
    const served = (await api(hubs[1 - i]!, "GET", "/v1/status")).links.find((l: any) => l.peer === "board");
    expect(served.compression).toBe("zstd");
    expect(served.lanes.find((l: any) => l.priority === 0)?.sent_frames).toBeGreaterThan(0);
    await startHub(i);
  }, 120_000);

  test("a NATS client's request reaches the board's responder; the reply comes back on its reply subject, not stored", async () => {
    const { createInbox, headers } = await import("nats");
    const { LocalClient } = await import("../../src/client/local-client.ts");
    const client = new LocalClient({ socket: board.socket });
    const responder = client.subscribe(
      "cmd.board.ask",
      "asker",
      async (msg) => {
        if (msg.replyTo) await client.reply(msg, "answer", { doubled: (msg.payload as { n: number }).n * 2 });
      },
      { from: "earliest" },
    );
    try {
      const inbox = createInbox();
      const replies = nc.subscribe(inbox, { max: 1 });
      await nc.flush();
      const id = crypto.randomUUID();
      const h = headers();
      h.set("Keyop-Type", "ask");
      h.set("Keyop-Reply-To", inbox);
      h.set("Keyop-Ttl-Ms", "30000");
      h.set("Nats-Msg-Id", id);
      await retrying(() => nc.jetstream().publish("kp.cmd.board.ask", JSON.stringify({ n: 21 }), { headers: h }));
      let got: { data: Uint8Array; headers?: { get(k: string): string } } | undefined;
      const reading = (async () => {
        for await (const m of replies) got = m as never;
      })();
      await waitFor(() => got !== undefined, "the reply on the NATS inbox", 30_000);
      await reading;
      expect(JSON.parse(new TextDecoder().decode(got!.data))).toEqual({ doubled: 42 });
      expect(got!.headers?.get("Keyop-Correlation-Id")).toBe(id);
      expect(got!.headers?.get("Keyop-Type")).toBe("answer");
      // The reply is stored nowhere: no inbox channel on the board or the hubs.
      for (const a of [board, ...hubs]) if (a) expect((await api(a, "GET", "/v1/channels")).channels.some((c: { channel: string }) => c.channel.startsWith("_inbox"))).toBe(false);
    } finally {
      responder.stop();
      await responder.done.catch(() => {});
    }
  }, 60_000);

  test("a board behind catches up on a consumer of its own while commands keep coming, then joins the hub's live feed: all in order, once", async () => {
    const js = nc.jetstream();
    const jsm = await retrying(() => nc.jetstreamManager());
    const send = async (from: number, n: number) => {
      for (let i = from; i < from + n; i++) await js.publish("kp.cmd.board.bulk", JSON.stringify({ n: i }));
    };
    const liveBefore = (await Promise.all(hubs.map(async (h) => (await api(h!, "GET", "/v1/status")).jetstream.live as number))).reduce((a, b) => a + b, 0);
    board.child.proc.kill("SIGTERM");
    await board.child.proc.exited;
    await send(0, 2000);
    board = await runAgent(join(dir, "board"), ["--config", boardConfig]);
    // More arrive while it catches up.
    await send(2000, 1000);
    const got = await collect(board, "cmd.board.bulk", "b", 3000, 60_000);
    expect(got.map((m) => m.payload.n)).toEqual(Array.from({ length: 3000 }, (_, k) => k));
    expect(new Set(got.map((m) => m.id)).size).toBe(3000);
    const liveAfter = (await Promise.all(hubs.map(async (h) => (await api(h!, "GET", "/v1/status")).jetstream.live as number))).reduce((a, b) => a + b, 0);
    expect(liveAfter).toBeGreaterThan(liveBefore);
    // Caught up, the board costs the cluster no consumer of its own: its filtered catch-up
    // consumer is gone, and only the hubs' unfiltered live feeds read CMD.
    const boardConsumers = async () => {
      let n = 0;
      for await (const ci of jsm.consumers.list("CMD")) if (ci.config.filter_subject === "kp.cmd.board.>") n++;
      return n;
    };
    await waitFor(async () => (await boardConsumers()) === 0, "the board's catch-up consumer deleted", 10_000, 100);
    await send(3000, 10);
    const more = await collect(board, "cmd.board.bulk", "b", 10, 30_000);
    expect(more.map((m) => m.payload.n)).toEqual(Array.from({ length: 10 }, (_, k) => 3000 + k));
  }, 120_000);

  test("the nats.js example reads the board's telemetry from the stream and sends it a command", async () => {
    const ids = await publish("t.example", 3);
    await drained("t.example");
    const proc = Bun.spawn([process.execPath, join(import.meta.dir, "..", "..", "examples", "nats", "service.mjs"), cluster.servers[0]!, "t.example"], { stdout: "pipe", stderr: "pipe" });
    const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
    expect(err).toBe("");
    expect(code).toBe(0);
    const lines = out.trim().split("\n");
    expect(lines.slice(0, 3).map((l) => JSON.parse(l).id)).toEqual(ids);
    expect(lines[0]).toContain('"origin":"board"');
    const cmd = await collect(board, "cmd.board.example", "e", 1, 30_000);
    expect(cmd[0]).toMatchObject({ type: "reboot", origin: "ops", payload: { after_s: 5 } });
  }, 60_000);

  test("a board away longer than the stream keeps messages: what retention removed is skipped, counted in status and audited", async () => {
    const js = nc.jetstream();
    const send = async (from: number, n: number) => {
      for (let i = from; i < from + n; i++) await js.publish("kp.small.board.log", JSON.stringify({ n: i, pad: "x".repeat(100) }));
    };
    await send(0, 5);
    const before = await collect(board, "small.board.log", "s", 5, 30_000);
    expect(before.map((m) => m.payload.n)).toEqual([0, 1, 2, 3, 4]);
    const expiredBefore = (await Promise.all(hubs.map(async (h) => (await api(h!, "GET", "/v1/status")).jetstream.expired as number))).reduce((a, b) => a + b, 0);
    // Its position reaches the replicated bucket (written soon after the ACK).
    const kv = await js.views.kv("keyop_positions");
    await waitFor(async () => (await kv.get("hub.board.SMALL"))?.string() === "5", "the board's position in SMALL is 5", 10_000, 20);
    // The board goes away; 200 more arrive, and the stream's 8 KiB keep only the newest.
    const jsm = await retrying(() => nc.jetstreamManager());
    board.child.proc.kill("SIGTERM");
    await board.child.proc.exited;
    await send(5, 200);
    const first = (await jsm.streams.info("SMALL")).state.first_seq;
    expect(first).toBeGreaterThan(6);
    board = await runAgent(join(dir, "board"), ["--config", boardConfig]);
    const kept = (await jsm.streams.info("SMALL")).state.messages;
    const after = await collect(board, "small.board.log", "s", kept, 30_000);
    // Everything still in the stream arrives, in order, starting where retention left off.
    expect(after.map((m) => m.payload.n)).toEqual(Array.from({ length: kept }, (_, k) => 205 - kept + k));
    const expired = (await Promise.all(hubs.map(async (h) => (await api(h!, "GET", "/v1/status")).jetstream.expired as number))).reduce((a, b) => a + b, 0);
    expect(expired - expiredBefore).toBe(first - 6);
    const audit = ["hub0", "hub1"].map((n) => (existsSync(join(dir, `${n}-audit.log`)) ? readFileSync(join(dir, `${n}-audit.log`), "utf8") : "")).join("");
    expect(audit).toContain('"event":"position_expired"');
    expect(audit).toContain(`"skipped":${first - 6}`);
  }, 60_000);

  test("quorum lost, then the whole cluster down: hubs refuse the board (unavailable), it keeps its backlog; back up: the backlog drains exactly once", async () => {
    // Two of three servers gone: the one left still answers the hubs, but no stream has a leader.
    await cluster.stopNode("n1", "SIGKILL");
    await cluster.stopNode("n2", "SIGKILL");
    const ids = await publish("t.outage", 3000);
    const refused = async () => {
      const l = (await api(board, "GET", "/v1/status")).links[0];
      return l.state !== "open" && /unavailable/.test(l.last_error ?? "");
    };
    await waitFor(refused, "the board is refused with unavailable (quorum lost)", 60_000, 100);
    // Both hubs know, the one that was not storing for anybody too (it asks every 5 s). A hub the
    // refused board turned to may first spend its publish retries (15 s) before it says so: on two
    // loaded cores the 20 s this waited before were not always enough.
    await waitFor(async () => (await Promise.all(hubs.map(async (h) => (await api(h!, "GET", "/v1/status")).jetstream.state))).every((st) => st !== "available"), "neither hub available", 45_000, 100);
    // And then the last one: the cluster is unreachable.
    await cluster.stopNode("n3", "SIGKILL");
    await waitFor(
      async () => (await Promise.all(hubs.map(async (h) => (await api(h!, "GET", "/v1/status")).jetstream.state))).every((st) => st === "unavailable"),
      "both hubs see the cluster gone",
      30_000,
      100,
    );
    // Still refused (its last attempt may have ended another way while the hubs were learning it: it tries again).
    await waitFor(refused, "the board still refused with unavailable", 30_000, 100);
    const waiting = (await api(board, "GET", "/v1/status")).links[0].backlog.find((b: { channel: string }) => b.channel === "t.outage");
    expect(waiting.messages).toBe(3000);
    for (const n of cluster.nodes) cluster.startNode(n.name);
    await cluster.waitReady(60_000);
    await drained("t.outage", 90_000);
    const recs = await streamRecords("t.outage");
    expect(recs.length).toBe(3000);
    expect(new Set(recs.map((r) => r.id))).toEqual(new Set(ids));
  }, 180_000);
});
