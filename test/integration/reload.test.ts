/**
 * Live reconfiguration with real processes: `keyop reload` and SIGHUP
 * re-read the configuration; hub peer rules, links, MQTT users, channel
 * policies and the log level change while the agent runs, other sessions
 * keep running, and an invalid file changes nothing.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import mqtt from "mqtt";
import { freePort, tmpDir, waitFor } from "../helpers.ts";
import { cli, fleet, runAgent, type AgentProc } from "./agent-process.ts";

let dir: string;
let tls: (name: string) => string;
const procs: AgentProc[] = [];

async function api(a: AgentProc, method: string, path: string, body?: unknown): Promise<any> {
  const r = await fetch(`http://k${path}`, { method, body: body === undefined ? undefined : JSON.stringify(body), headers: { "content-type": "application/json" }, unix: a.socket } as RequestInit);
  return r.json();
}
const linkOf = async (a: AgentProc, target?: string) => (await api(a, "GET", "/v1/status")).links.filter((l: any) => target === undefined || l.target === target || l.peer === target);
const pull = async (a: AgentProc, channel: string, sub: string) => (await api(a, "GET", `/v1/channels/${channel}/messages?subscriber=${sub}&from=earliest&max=100`)).messages ?? [];

async function start(name: string, yaml: string): Promise<{ a: AgentProc; cfg: string }> {
  const cfg = join(dir, `${name}.yaml`);
  writeFileSync(cfg, yaml);
  const a = await runAgent(join(dir, name), ["--config", cfg]);
  procs.push(a);
  return { a, cfg };
}

const FED = "federation:\n  heartbeat_ms: 300ms\n  reconnect_base_ms: 50ms\n  reconnect_max_ms: 200ms\n";

beforeAll(async () => {
  dir = tmpDir();
  tls = await fleet(dir, ["hub", "hub2", "board", "board2"]);
}, 60_000);

afterAll(async () => {
  for (const p of procs) p.child.proc.kill("SIGTERM");
  await Promise.all(procs.map((p) => p.child.proc.exited));
});

describe("keyop reload", () => {
  test("a hub peer's rules narrowed: that peer gets only what they allow; another peer's session keeps running; an invalid file changes nothing", async () => {
    const port = freePort();
    const hubYaml = (boardSub: string) =>
      tls("hub") +
      FED +
      `hub:\n  listen: 127.0.0.1:${port}\n  peers:\n    - {name: board, publish: ["t.>"], subscribe: ["${boardSub}"]}\n    - {name: board2, publish: ["t.>"], subscribe: ["cmd.>"]}\n`;
    const { a: hub, cfg: hubCfg } = await start("hub-a", hubYaml("cmd.>"));
    const boardYaml = (name: string) => tls(name) + FED + `links:\n  - hub: 127.0.0.1:${port}\n    publish: ["t.>"]\n    subscribe: ["cmd.>"]\n`;
    const { a: board } = await start("board-a", boardYaml("board"));
    const { a: board2 } = await start("board2-a", boardYaml("board2"));
    await waitFor(async () => (await linkOf(hub)).filter((l: any) => l.state === "open").length === 2, "both boards connected", 20_000);
    const since2 = (await linkOf(hub, "board2"))[0].connected_since;

    writeFileSync(hubCfg, hubYaml("cmd.a.>"));
    const r = await cli(["reload", "--socket", hub.socket]);
    expect(r.code).toBe(0);
    expect(r.out).toContain("hub peer board changed");
    await waitFor(async () => (await linkOf(hub, "board"))[0]?.state === "open", "board back with its new rules", 20_000);
    await api(hub, "POST", "/v1/channels/cmd.b.x/messages", { type: "c", payload: "not for board" });
    await api(hub, "POST", "/v1/channels/cmd.a.x/messages", { type: "c", payload: "for board" });
    await waitFor(async () => (await pull(board, "cmd.a.x", "r")).length === 1, "cmd.a.x reaches the board", 20_000);
    await waitFor(async () => (await pull(board2, "cmd.b.x", "r")).length === 1, "board2 still gets cmd.b.x", 20_000);
    expect(await pull(board, "cmd.b.x", "r")).toEqual([]);
    // board2's session was not touched.
    expect((await linkOf(hub, "board2"))[0].connected_since).toBe(since2);

    // A file with two problems: both reported, nothing changed.
    writeFileSync(hubCfg, `${hubYaml("cmd.>")}nonsense: 1\nstorage:\n  sync: sometimes\n`);
    const bad = await cli(["reload", "--socket", hub.socket]);
    expect(bad.code).toBe(1);
    expect(bad.err).toContain("nonsense");
    expect(bad.err).toContain("storage.sync");
    expect(hub.logs()).toContain("configuration refused, nothing changed");
    await api(hub, "POST", "/v1/channels/cmd.b.y/messages", { type: "c", payload: "still not for board" });
    await api(hub, "POST", "/v1/channels/cmd.a.y/messages", { type: "c", payload: "for board" });
    await waitFor(async () => (await pull(board, "cmd.a.y", "r")).length === 1, "cmd.a.y reaches the board", 20_000);
    expect(await pull(board, "cmd.b.y", "r")).toEqual([]);

    // A removed peer is disconnected and refused.
    writeFileSync(hubCfg, tls("hub") + FED + `hub:\n  listen: 127.0.0.1:${port}\n  peers:\n    - {name: board, publish: ["t.>"], subscribe: ["cmd.a.>"]}\n`);
    const removed = await cli(["reload", "--socket", hub.socket]);
    expect(removed.out).toContain("hub peer board2 removed");
    await waitFor(async () => (await linkOf(board2))[0].state !== "open" && /unknown peer|removed/.test((await linkOf(board2))[0].last_error ?? ""), "board2 refused", 20_000);
    expect((await linkOf(hub, "board"))[0].state).toBe("open");
  }, 90_000);

  test("links added, changed and removed on a board; log level, channel policies; a restart-only key is named", async () => {
    const p1 = freePort();
    const p2 = freePort();
    const hubYaml = (name: string, port: number) => tls(name) + FED + `hub:\n  listen: 127.0.0.1:${port}\n  peers:\n    - {name: board, publish: ["t.>", "u.>"], subscribe: []}\n`;
    const { a: hub1 } = await start("hub-b1", hubYaml("hub", p1));
    const { a: hub2 } = await start("hub-b2", hubYaml("hub2", p2));
    const link = (port: number, pub: string) => `  - hub: 127.0.0.1:${port}\n    publish: ["${pub}"]\n`;
    const { a: board, cfg } = await start("board-b", tls("board") + FED + `links:\n${link(p1, "t.>")}`);
    await waitFor(async () => (await linkOf(board))[0]?.state === "open", "link 1 open", 20_000);
    const since1 = (await linkOf(board))[0].connected_since;

    writeFileSync(cfg, tls("board") + FED + `log:\n  level: debug\nchannels:\n  - {pattern: "t.>", ttl: 1h}\nlinks:\n${link(p1, "t.>")}${link(p2, "t.>")}`);
    const added = await cli(["reload", "--socket", board.socket]);
    expect(added.code).toBe(0);
    expect(added.out).toContain(`link to 127.0.0.1:${p2} added`);
    expect(added.out).toContain("log level debug");
    expect(added.out).toContain("retention and channel policies");
    await waitFor(async () => (await linkOf(board)).every((l: any) => l.state === "open") && (await linkOf(board)).length === 2, "both links open", 20_000);
    expect((await linkOf(board, `127.0.0.1:${p1}`))[0].connected_since).toBe(since1);
    await api(board, "POST", "/v1/channels/t.x/messages", { type: "r", payload: 1 });
    await waitFor(async () => (await pull(hub2, "t.x", "r")).length === 1, "the new link carries t.x", 20_000);
    const stored = (await pull(board, "t.x", "local"))[0];
    expect(stored.expires).toBeGreaterThan(Date.now() + 3_000_000); // the channel's new default TTL

    // The second link now carries u.> instead (changed), the first is removed; a key only a restart applies.
    writeFileSync(cfg, tls("board") + FED + `api:\n  max_message_bytes: 128KiB\nlinks:\n${link(p2, "u.>")}`);
    const changed = await cli(["reload", "--socket", board.socket]);
    expect(changed.code).toBe(0);
    expect(changed.out).toContain(`link to 127.0.0.1:${p1} removed`);
    expect(changed.out).toContain(`link to 127.0.0.1:${p2} changed`);
    expect(changed.out).toContain("applied at the next restart only: api");
    await waitFor(async () => (await linkOf(board)).length === 1 && (await linkOf(board))[0].state === "open", "one link, open", 20_000);
    await api(board, "POST", "/v1/channels/u.y/messages", { type: "r", payload: 2 });
    await waitFor(async () => (await pull(hub2, "u.y", "r")).length === 1, "u.y over the changed link", 20_000);
    await waitFor(async () => (await linkOf(hub1, "board")).length === 0, "hub 1 lost the board's session", 20_000);
  }, 90_000);

  test("mqtt.users: a removed user's client is disconnected, a narrowed user's next publish is refused; SIGHUP does the same as keyop reload", async () => {
    const port = freePort();
    const hash = await Bun.password.hash("pw", { algorithm: "argon2id" });
    const users = (alicePublish: string, withBob: boolean) =>
      `mqtt:\n  listen: 127.0.0.1:${port}\n  users:\n    - {name: alice, password_hash: "${hash}", publish: ["${alicePublish}"], subscribe: []}\n` +
      (withBob ? `    - {name: bob, password_hash: "${hash}", publish: ["b.>"], subscribe: []}\n` : "");
    const { a, cfg } = await start("mqtt-c", users("a.>", true));
    const alice = await mqtt.connectAsync(`mqtt://127.0.0.1:${port}`, { username: "alice", password: "pw", protocolVersion: 5, reconnectPeriod: 0 });
    const bob = await mqtt.connectAsync(`mqtt://127.0.0.1:${port}`, { username: "bob", password: "pw", protocolVersion: 5, reconnectPeriod: 0 });
    let bobGone = false;
    bob.on("close", () => (bobGone = true));
    await alice.publishAsync("a/x", "1", { qos: 1 });
    writeFileSync(cfg, users("a.ok.>", false));
    a.child.proc.kill("SIGHUP");
    await waitFor(() => bobGone, "bob disconnected", 10_000);
    await waitFor(() => a.logs().includes("configuration reloaded"), "the reload logged");
    // alice's session stays; her next publish outside the new rules is refused (MQTT 5: 0x87).
    const refused = await alice.publishAsync("a/x", "2", { qos: 1 }).then(
      (p) => (p as unknown as { reasonCode?: number })?.reasonCode ?? 0,
      (e) => (e as { code?: number }).code ?? -1,
    );
    expect(refused).toBe(0x87);
    await alice.publishAsync("a/ok/y", "3", { qos: 1 });
    expect((await pull(a, "a.x", "r")).length).toBe(1);
    expect((await pull(a, "a.ok.y", "r")).length).toBe(1);
    await alice.endAsync();
  }, 60_000);
});
