/**
 * Links that fit slow paths, with real `keyop run` processes: an alarm
 * overtakes a telemetry backlog on a shaped link, the bandwidth cap holds,
 * batches are compressed with a hub that agrees and plain with one side
 * that does not offer it.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { freePort, tmpDir, waitFor } from "../helpers.ts";
import { cli, fleet, runAgent, type AgentProc } from "./agent-process.ts";
import { FaultProxy } from "./fault-proxy.ts";
import { PROTOCOL_VERSION } from "../../src/federation/frame.ts";
import { type PeerSession, sessionHandler } from "../../src/federation/session.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { MtlsServer } from "../../src/pki/mtls.ts";
import { loadTlsMaterial } from "../../src/pki/tls.ts";

const api = (a: AgentProc, method: string, path: string, body?: string, type = "application/json") =>
  fetch(`http://k${path}`, { method, body, headers: { "content-type": type }, unix: a.socket } as RequestInit).then((r) => r.json() as Promise<any>);

/** A JSON telemetry reading of about 200 bytes. */
const reading = (i: number) => ({
  type: "reading",
  payload: { device: "board-17", sensor: "engine-room-temperature", seq: i, celsius: 20 + (i % 50) / 10, humidity: 40 + (i % 13), ts: 1_795_940_853_240 + i * 1000 },
});
const ndjson = (from: number, n: number) => Array.from({ length: n }, (_, i) => JSON.stringify(reading(from + i))).join("\n");

/** Messages of `channel` on `a` so far (read with a subscriber that never acks). */
async function pulled(a: AgentProc, channel: string): Promise<any[]> {
  const r = await api(a, "GET", `/v1/channels/${channel}/messages?subscriber=probe&from=earliest&max=10000`);
  return r.messages ?? [];
}

const link = async (a: AgentProc) => (await api(a, "GET", "/v1/status")).links[0];
const peer = async (hub: AgentProc, name: string) => (await api(hub, "GET", "/v1/status")).links.find((l: any) => l.peer === name);

let dir: string;
let hub: AgentProc, shaped: AgentProc, squeezed: AgentProc, plain: AgentProc, board: AgentProc, stuck: AgentProc, fresh: AgentProc;
let slow: FaultProxy, counted: FaultProxy, down: FaultProxy, never: FaultProxy;
let frozen: MtlsServer<PeerSession>;
let frozenBatches = 0;
const frozenClosed: string[] = [];
const CAP = 24 * 1024;

beforeAll(async () => {
  dir = tmpDir();
  const tls = await fleet(dir, ["hub", "shaped", "squeezed", "plain", "board", "stuck", "fresh"]);
  const port = freePort();
  const fed = "federation:\n  heartbeat_ms: 1s\n  reconnect_base_ms: 100ms\n  reconnect_max_ms: 1s\n";
  const cfg = (n: string, body: string) => {
    const f = join(dir, `${n}.yaml`);
    writeFileSync(f, `${tls(n)}storage:\n  sync: none\n${body}`);
    return f;
  };
  const peers = ["shaped", "squeezed", "plain", "board", "stuck", "fresh"]
    .map(
      (n) =>
        `    - name: ${n}\n      publish: ["t.>", "alarm.>", "state.>", "buf.>", "drop.>", "ttl.>"]\n` +
        // What the hub sends `plain`: commands in lane 0, bulk in the default lane, under a cap.
        (n === "plain" ? `      subscribe: [{pattern: "cmd.>", priority: 0}, "bulk.>"]\n      max_bytes_per_s: 64KiB\n` : "      subscribe: []\n"),
    )
    .join("");
  hub = await runAgent(join(dir, "hub"), ["--config", cfg("hub", `${fed}hub:\n  listen: 127.0.0.1:${port}\n  peers:\n${peers}`)]);
  // A cellular-like path: 32 KiB/s and 150 ms each way; the link's cap sits below it.
  slow = new FaultProxy(port);
  slow.rateBytesPerS = 32 * 1024;
  slow.delayMs = 150;
  counted = new FaultProxy(port);
  const linkTo = (p: number, rules: string, extra = "") => `links:\n  - hub: 127.0.0.1:${p}\n    publish: ${rules}\n    start: earliest\n${extra}`;
  shaped = await runAgent(join(dir, "shaped"), [
    "--config",
    cfg("shaped", `${fed}  compression: none\n${linkTo(slow.port, `[{pattern: "alarm.>", priority: 0}, "t.>"]`, `    max_bytes_per_s: ${CAP}\n`)}`),
  ]);
  squeezed = await runAgent(join(dir, "squeezed"), ["--config", cfg("squeezed", `${fed}${linkTo(counted.port, `["t.>"]`)}`)]);
  plain = await runAgent(join(dir, "plain"), ["--config", cfg("plain", `${fed}  compression: none\n${linkTo(port, `["t.>"]`, `    subscribe: ["cmd.plain.>", "bulk.>"]\n`)}`)]);
  // A board whose path goes dead after its first session (the link's cursors are made then).
  down = new FaultProxy(port);
  const channels = [
    `  - {pattern: "state.>", full_policy: latest}`,
    `  - {pattern: "buf.>", max_bytes: 32KiB, full_policy: reject}`,
    `  - {pattern: "drop.>", max_bytes: 32KiB, full_policy: drop_oldest}`,
    `  - {pattern: "ttl.>", ttl: 1s}`,
  ].join("\n");
  board = await runAgent(join(dir, "board"), ["--config", cfg("board", `${fed}channels:\n${channels}\n${linkTo(down.port, `["state.>", "buf.>", "drop.>", "ttl.>"]`)}`)]);
  // Open on the devices' side too: a link's cursors are made when its session opens there.
  // A board installed where its link has never worked yet: its link (start: latest) is refused.
  never = new FaultProxy(port);
  never.refusing = true;
  fresh = await runAgent(join(dir, "fresh"), [
    "--config",
    cfg("fresh", `${fed}channels:\n  - {pattern: "buf.>", max_bytes: 32KiB, full_policy: reject}\nlinks:\n  - hub: 127.0.0.1:${never.port}\n    publish: ["buf.>", "t.>"]\n`),
  ]);
  // A hub of the same identity whose storage hangs: it answers heartbeats and never acknowledges.
  const pki = join(dir, "pki");
  const material = await loadTlsMaterial({ cert: join(pki, "hub.crt"), key: join(pki, "hub.key"), ca: join(pki, "ca.crt") });
  frozen = MtlsServer.listen<PeerSession>(
    { hostname: "127.0.0.1", port: 0, material, logger: silentLogger },
    sessionHandler(
      { role: "hub", maxBody: 2 << 20, heartbeatMs: 1000, logger: silentLogger },
      {
        onHello: (_s, h) => ({ version: PROTOCOL_VERSION, name: "hub", publish: h.publish, subscribe: h.subscribe, heartbeatMs: h.heartbeatMs, maxBatchBytes: h.maxBatchBytes }),
        onBatch: () => frozenBatches++,
        onClose: (_s, reason) => frozenClosed.push(reason),
      },
    ),
  );
  // The first hub of its list is the frozen one; the next attempt takes the real one.
  stuck = await runAgent(join(dir, "stuck"), ["--config", cfg("stuck", `${fed}links:\n  - hub: ["127.0.0.1:${frozen.port}", "127.0.0.1:${port}"]\n    publish: ["t.>"]\n    start: earliest\n`)]);
  for (const a of [shaped, squeezed, plain, board, stuck]) await waitFor(async () => (await link(a))?.state === "open", "link open", 20_000);
}, 60_000);

afterAll(async () => {
  slow?.stop();
  counted?.stop();
  down?.stop();
  frozen?.stop(true);
  never?.stop();
  for (const a of [shaped, squeezed, plain, board, stuck, fresh, hub]) {
    a?.child.proc.kill("SIGTERM");
    await a?.child.proc.exited;
  }
});

describe("links on slow paths", () => {
  test("an alarm overtakes a telemetry backlog, the cap holds within 10% over 10 s, and telemetry keeps its order", async () => {
    // About 1 MB of telemetry: 40 s at the cap.
    for (let k = 0; k < 4; k++) expect((await api(shaped, "POST", "/v1/channels/t.engine/messages", ndjson(k * 1000, 1000), "application/x-ndjson")).results).toHaveLength(1000);
    const t0 = performance.now();
    await waitFor(() => performance.now() - t0 >= 2000, "2 s into the drain", 5000, 50);
    const at2 = slow.bytes().up;
    const sent = await api(shaped, "POST", "/v1/channels/alarm.fire/messages", JSON.stringify({ type: "alarm", payload: { zone: 3 } }));
    const published = performance.now();
    const alarm = await waitFor(async () => (await pulled(hub, "alarm.fire"))[0], "the alarm at the hub", 10_000, 20);
    const latency = performance.now() - published;
    expect(alarm.id).toBe(sent.id);
    // 150 ms each way, a batch ahead of it of at most half a second at the cap, and the polling.
    expect(latency).toBeLessThan(1500);
    const before = (await pulled(hub, "t.engine")).length;
    expect(before).toBeLessThan(2000); // FIFO would have made it wait for all 4,000
    await waitFor(() => performance.now() - t0 >= 12_000, "12 s into the drain", 15_000, 50);
    const rate = ((slow.bytes().up - at2) * 1000) / (performance.now() - t0 - 2000);
    expect(rate).toBeGreaterThan(CAP * 0.9);
    expect(rate).toBeLessThan(CAP * 1.1);
    const st = await link(shaped);
    expect(st.max_bytes_per_s).toBe(CAP);
    expect(st.lanes.map((l: any) => l.priority)).toEqual([0, 4]);
    expect(st.lanes[0].sent_frames).toBe(1);
    const seqs = (await pulled(hub, "t.engine")).map((m) => m.payload.seq);
    expect(seqs.length).toBeGreaterThan(before);
    expect(seqs).toEqual(seqs.map((_, i) => i));
  }, 40_000);

  test("batches go compressed with zstd to a hub that agrees, at least 3x smaller, and plain from a device that offers none", async () => {
    for (const a of [squeezed, plain]) expect((await api(a, "POST", "/v1/channels/t.json/messages", ndjson(0, 1000), "application/x-ndjson")).results).toHaveLength(1000);
    await waitFor(async () => (await api(hub, "GET", "/v1/channels")).channels.find((c: any) => c.channel === "t.json")?.messages === 2000, "2,000 readings at the hub", 20_000, 50);
    const z = await link(squeezed);
    expect(z.compression).toBe("zstd");
    expect(z.wire_bytes.sent_wire * 3).toBeLessThan(z.wire_bytes.sent_raw);
    // What crossed the path, TLS included, is what the status says went out (plus handshake and heartbeats).
    expect(counted.bytes().up).toBeLessThan(z.wire_bytes.sent_wire + 20_000);
    expect(await peer(hub, "squeezed")).toMatchObject({ compression: "zstd", wire_bytes: { received_raw: z.wire_bytes.sent_raw, received_wire: z.wire_bytes.sent_wire } });
    const p = await link(plain);
    expect(p.compression).toBeNull();
    expect(p.wire_bytes.sent_wire).toBe(p.wire_bytes.sent_raw);
    expect((await peer(hub, "plain")).compression).toBeNull();
    const metrics = await fetch("http://k/metrics", { unix: squeezed.socket } as RequestInit).then((r) => r.text());
    expect(metrics).toMatch(/keyop_federation_batch_bytes\{[^}]*direction="sent"[^}]*stage="wire"[^}]*\} \d+/);
  }, 30_000);

  test("offline board: expired messages are not forwarded, a latest channel sends its newest only, reject refuses with 507 and takes again once drained, drop_oldest keeps the newest", async () => {
    down.blackholed = true;
    await waitFor(async () => (await link(board)).state !== "open", "the board's link down (heartbeats)", 15_000, 100);
    const post = (channel: string, body: unknown) =>
      fetch(`http://k/v1/channels/${channel}/messages`, { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" }, unix: board.socket } as RequestInit);
    for (let i = 0; i < 5; i++) expect((await post("ttl.x", { type: "n", payload: i })).status).toBe(201);
    const keep = (await (await post("ttl.x", { type: "n", payload: "keep", ttl_ms: 600_000 })).json()) as any;
    expect((await post("ttl.x", { type: "n", payload: 1, ttl_ms: 0 })).status).toBe(400);
    const viaCli = await cli(["pub", "ttl.y", '{"a":1}', "--ttl", "300ms", "--socket", board.socket]);
    expect(viaCli.code).toBe(0);
    for (let i = 1; i <= 50; i++) expect((await post("state.dev", { type: "state", payload: { i } })).status).toBe(201);
    let stored = 0;
    let refusal: Response | undefined;
    for (let i = 0; i < 100 && !refusal; i++) {
      const r = await post("buf.x", { type: "n", payload: { i, pad: "x".repeat(1000) } });
      if (r.status === 201) stored++;
      else refusal = r;
    }
    expect(refusal?.status).toBe(507);
    expect(((await refusal!.json()) as any).error.code).toBe("buffer_full");
    for (let i = 0; i < 100; i++) expect((await post("drop.x", { type: "n", payload: { i, pad: "x".repeat(1000) } })).status).toBe(201);
    const published = Date.now();
    await waitFor(() => Date.now() - published > 1200, "the ttl of 1 s passed", 3000, 20);
    down.heal();
    await waitFor(async () => (await link(board))?.state === "open", "the board's link up", 20_000);
    const count = async (c: string) => (await api(hub, "GET", "/v1/channels")).channels.find((x: any) => x.channel === c)?.messages ?? 0;
    await waitFor(async () => (await count("buf.x")) === stored && (await count("state.dev")) === 1 && (await count("ttl.x")) === 1, "the board's backlog at the hub", 20_000, 50);
    expect((await pulled(hub, "ttl.x")).map((m) => m.id)).toEqual([keep.id]);
    expect(await count("ttl.y")).toBe(0);
    expect((await pulled(hub, "state.dev")).map((m) => m.payload)).toEqual([{ i: 50 }]);
    const dropped = await waitFor(
      async () => {
        const got = await pulled(hub, "drop.x");
        return got.at(-1)?.payload.i === 99 ? got : undefined;
      },
      "the newest of drop.x at the hub",
      10_000,
      50,
    );
    expect(dropped!.length).toBeLessThan(40);
    const ch = (await api(board, "GET", "/v1/channels")).channels;
    const of = (c: string) => ch.find((x: any) => x.channel === c);
    expect(of("ttl.x").expired).toBeGreaterThanOrEqual(5);
    expect(of("ttl.y").expired).toBe(1);
    expect(of("state.dev").superseded).toBe(49);
    expect(of("buf.x").rejected).toBe(1);
    // Drained: the reject channel lets go of what the hub acknowledged and takes publishes again.
    await waitFor(async () => (await post("buf.x", { type: "n", payload: { i: "again" } })).status === 201, "buf.x takes again", 10_000, 100);
    const metrics = await fetch("http://k/metrics", { unix: board.socket } as RequestInit).then((r) => r.text());
    expect(metrics).toContain('keyop_messages_superseded_total{channel="state.dev"} 49');
  }, 60_000);

  test("the stall watchdog ends a session whose hub answers heartbeats but acknowledges nothing; the link goes on to the next hub and drains", async () => {
    expect((await link(stuck)).target).toBe(`127.0.0.1:${frozen.port}`);
    const body = Array.from({ length: 200 }, (_, i) => JSON.stringify({ type: "n", payload: { i, pad: "x".repeat(1000) } })).join("\n");
    expect((await api(stuck, "POST", "/v1/channels/t.stuck/messages", body, "application/x-ndjson")).results).toHaveLength(200);
    const t0 = performance.now();
    const st = await waitFor(
      async () => {
        const l = await link(stuck);
        return l.stalls >= 1 ? l : undefined;
      },
      "the watchdog ended the session",
      15_000,
      100,
    );
    // Three heartbeats of 1 s without an acknowledgement; the session's own heartbeats never failed.
    expect(performance.now() - t0).toBeGreaterThan(2500);
    expect(frozenBatches).toBeGreaterThan(0);
    // The close frame reaches the frozen hub a moment after the link counts the stall.
    await waitFor(() => frozenClosed.some((r) => r.includes("peer closed: stalled")), "the frozen hub told why", 5_000, 20);
    expect(st.last_error === null || String(st.last_error).includes("stalled")).toBe(true);
    const metrics = await fetch("http://k/metrics", { unix: stuck.socket } as RequestInit).then((r) => r.text());
    expect(metrics).toMatch(/keyop_link_stalls\{kind="link",target="[^"]+"\} [1-9]/);
    expect(metrics).toMatch(/keyop_federation_oldest_unacked_seconds\{[^}]*priority="4"[^}]*\} \d/);
    await waitFor(async () => (await api(hub, "GET", "/v1/channels")).channels.find((c: any) => c.channel === "t.stuck")?.messages === 200, "the backlog at the hub", 30_000, 100);
    // The hub counts a batch when it stores it; its acknowledgement reaches the board after.
    await waitFor(async () => (await link(stuck)).backlog.find((b: any) => b.channel === "t.stuck")?.messages === 0, "the board's backlog acknowledged", 10_000, 50);
    expect((await link(stuck)).backlog.find((b: any) => b.channel === "t.stuck")).toMatchObject({ messages: 0, oldest_age_ms: null });
  }, 60_000);

  test("a hub sends a peer its channels in the peer's lanes, under the peer's cap", async () => {
    const body = Array.from({ length: 200 }, (_, i) => JSON.stringify({ type: "n", payload: { i, pad: "x".repeat(500) } })).join("\n");
    expect((await api(hub, "POST", "/v1/channels/bulk.files/messages", body, "application/x-ndjson")).results).toHaveLength(200);
    const cmd = await api(hub, "POST", "/v1/channels/cmd.plain.reboot/messages", JSON.stringify({ type: "cmd", payload: { now: true } }));
    const got = await waitFor(async () => (await pulled(plain, "cmd.plain.reboot"))[0], "the command at the device", 10_000, 20);
    expect(got.id).toBe(cmd.id);
    // 200 x ~600 bytes at 64 KiB/s take about 2 s: the command did not wait for them.
    expect((await pulled(plain, "bulk.files")).length).toBeLessThan(200);
    const p = await peer(hub, "plain");
    expect(p.max_bytes_per_s).toBe(65536);
    expect(p.lanes.map((l: any) => l.priority)).toEqual([0, 4]);
    expect(p.lanes[0].sent_frames).toBe(1);
    await waitFor(async () => (await pulled(plain, "bulk.files")).length === 200, "the bulk at the device", 15_000, 100);
  }, 30_000);

  test("a board whose link never connected yet keeps what it publishes for the link: reject refuses instead of dropping, and start: latest loses nothing", async () => {
    expect((await link(fresh)).state).not.toBe("open");
    const first = await api(fresh, "POST", "/v1/channels/t.boot/messages", JSON.stringify({ type: "n", payload: "first light" }));
    let stored = 0;
    let status = 0;
    for (let i = 0; i < 100 && status !== 507; i++) {
      const r = await fetch("http://k/v1/channels/buf.fresh/messages", {
        method: "POST",
        body: JSON.stringify({ type: "n", payload: { i, pad: "x".repeat(1000) } }),
        headers: { "content-type": "application/json" },
        unix: fresh.socket,
      } as RequestInit);
      status = r.status;
      if (r.status === 201) stored++;
    }
    expect(status).toBe(507);
    // What waits is in the link's status before it ever connected.
    expect((await link(fresh)).backlog.find((b: any) => b.channel === "buf.fresh")).toMatchObject({ messages: stored });
    never.refusing = false;
    const count = async (c: string) => (await api(hub, "GET", "/v1/channels")).channels.find((x: any) => x.channel === c)?.messages ?? 0;
    await waitFor(async () => (await count("buf.fresh")) === stored && (await count("t.boot")) === 1, "what the board kept, at the hub", 20_000, 50);
    expect((await pulled(hub, "t.boot"))[0].id).toBe(first.id);
    // The link's own cursors took over from the hold, which is gone.
    const subs = (await api(fresh, "GET", "/v1/channels")).channels.flatMap((c: any) => c.subscribers.map((x: any) => x.name));
    expect(subs).toContain("_fed.hub");
    expect(subs.some((n: string) => n.startsWith("_fed..hold-"))).toBe(false);
  }, 30_000);
});
