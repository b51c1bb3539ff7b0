/**
 * Request/reply across federation with real `keyop run` processes: a
 * service on the hub asks a board; the reply travels back over the link
 * to exactly the requester, is never stored, and fails fast or in time
 * when the board cannot answer.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { ApiError, LocalClient } from "../../src/client/local-client.ts";
import { encodeEnvelope } from "../../src/envelope/envelope.ts";
import { helloFrame, replyFrame } from "../../src/federation/messages.ts";
import { freePort, tmpDir, waitFor } from "../helpers.ts";
import { fleet, runAgent, type AgentProc } from "./agent-process.ts";

let dir: string;
let hub: AgentProc;
let board: AgentProc;
let boardCfg: string;
let hubClient: LocalClient;
let hubPort: number;

const linkOpen = async (a: AgentProc) => ((await (await fetch("http://k/v1/status", { unix: a.socket } as RequestInit)).json()) as any).links[0]?.state === "open";
const peerOpen = async () => ((await (await fetch("http://k/v1/status", { unix: hub.socket } as RequestInit)).json()) as any).links.some((l: any) => l.peer === "board" && l.state === "open");

beforeAll(async () => {
  dir = tmpDir();
  const tls = await fleet(dir, ["hub", "board", "rogue"]);
  const port = freePort();
  hubPort = port;
  const fed = "federation:\n  heartbeat_ms: 1s\n  reconnect_base_ms: 100ms\n  reconnect_max_ms: 500ms\n";
  const hubCfg = join(dir, "hub.yaml");
  writeFileSync(
    hubCfg,
    `${tls("hub")}${fed}audit:\n  path: ${dir}/hub-audit.log\nhub:\n  listen: 127.0.0.1:${port}\n  peers:\n    - {name: board, publish: ["t.>"], subscribe: ["cmd.board.>"]}\n    - {name: rogue, publish: [], subscribe: []}\n`,
  );
  boardCfg = join(dir, "board.yaml");
  writeFileSync(boardCfg, `${tls("board")}${fed}links:\n  - hub: 127.0.0.1:${port}\n    publish: ["t.>"]\n    subscribe: ["cmd.board.>"]\n`);
  hub = await runAgent(join(dir, "hub"), ["--config", hubCfg]);
  board = await runAgent(join(dir, "board"), ["--config", boardCfg]);
  hubClient = new LocalClient({ socket: hub.socket });
  await waitFor(() => linkOpen(board), "the board's link open", 20_000, 50);
}, 60_000);

afterAll(async () => {
  for (const a of [board, hub]) {
    a?.child.proc.kill("SIGTERM");
    await a?.child.proc.exited;
  }
});

/** A responder on the board: LocalClient on a stream, answering with the command it got. */
function responder(a: AgentProc) {
  const c = new LocalClient({ socket: a.socket });
  return c.subscribe("cmd.board.>", "agent", async (msg) => {
    if (!msg.replyTo) return;
    // A request answered already, or whose requester gave up, is refused (no_request): done with it.
    await c.reply(msg, "done", { did: msg.channel, with: msg.payload }).catch((err) => {
      if (!(err instanceof ApiError && err.code === "no_request")) throw err;
    });
  });
}

/** A peer that speaks the protocol by hand: HELLO, then `frames`; resolves once they are written. */
function rawPeer(name: string, frames: Uint8Array[]): Promise<{ close: () => void }> {
  const pki = join(dir, "pki");
  return new Promise((resolve, reject) => {
    Bun.connect({
      hostname: "127.0.0.1",
      port: hubPort,
      tls: { ca: Bun.file(join(pki, "ca.crt")), cert: Bun.file(join(pki, `${name}.crt`)), key: Bun.file(join(pki, `${name}.key`)), serverName: "127.0.0.1" },
      socket: {
        open: (sock) => {
          sock.write(Buffer.concat([helloFrame({ versions: [1], name, mode: "link", publish: [], subscribe: [], heartbeatMs: 10_000, maxBatchBytes: 1 << 20 }), ...frames]));
          resolve({ close: () => sock.end() });
        },
        data: () => {},
        error: () => {},
      },
    }).catch(reject);
  });
}

describe("request/reply across a link", () => {
  test("hub -> board -> hub: the reply reaches the requester, from the board, with the request's id; nothing of it is stored", async () => {
    const sub = responder(board);
    const reply = await hubClient.request("cmd.board.reboot", "cmd", { delay_s: 5 }, { timeoutMs: 5000 });
    expect(reply).toMatchObject({ type: "done", origin: "board", payload: { did: "cmd.board.reboot", with: { delay_s: 5 } } });
    const asked = await hubClient.pull("cmd.board.reboot", "audit", { from: "earliest", max: 1 });
    expect(reply.correlationId).toBe(asked[0]!.id);
    for (const a of [hub, board]) {
      const ch = ((await (await fetch("http://k/v1/channels", { unix: a.socket } as RequestInit)).json()) as any).channels.map((c: any) => c.channel);
      expect(ch.some((c: string) => c.startsWith("_inbox"))).toBe(false);
    }
    sub.stop();
    await sub.done;
  }, 30_000);

  test("a peer can answer only a request it was sent: a forged reply from another peer is dropped and audited, the board's reply arrives", async () => {
    const c = new LocalClient({ socket: board.socket });
    // The board answers after a while, so that the forgery comes first.
    const sub = c.subscribe("cmd.board.slow", "slow", async (msg) => {
      await Bun.sleep(300);
      if (msg.replyTo) await c.reply(msg, "done", "from the board");
    });
    const pending = hubClient.request("cmd.board.slow", "cmd", {}, { timeoutMs: 5000 });
    const asked = (await waitFor(async () => (await hubClient.pull("cmd.board.slow", "probe", { from: "earliest", max: 1 }))[0], "the request in the hub's log"))!;
    const forged = encodeEnvelope({ id: "forged-1", ts: Date.now(), channel: asked.replyTo!, origin: "rogue", type: "done", route: ["rogue"], payload: "forged" });
    const rogue = await rawPeer("rogue", [replyFrame({ inbox: asked.replyTo!, body: forged })]);
    const audit = async () =>
      (await Bun.file(join(dir, "hub-audit.log")).text())
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l));
    await waitFor(async () => (await audit()).some((e) => e.event === "policy_violation" && e.peer === "rogue"), "the forged reply audited", 10_000, 50);
    expect((await pending).payload).toBe("from the board");
    rogue.close();
    sub.stop();
    await sub.done;
  }, 30_000);

  test("a board whose responder is gone: timeout; a board that is offline: no_responders at once; durable: answered once it is back", async () => {
    const err = await hubClient.request("cmd.board.reboot", "cmd", {}, { timeoutMs: 500 }).catch((e) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect(err.code).toBe("timeout");
    board.child.proc.kill("SIGTERM");
    await board.child.proc.exited;
    await waitFor(async () => !(await peerOpen()), "the hub sees the board gone", 10_000, 50);
    const t0 = performance.now();
    const none = await hubClient.request("cmd.board.reboot", "cmd", {}, { timeoutMs: 5000 }).catch((e) => e);
    expect(none.code).toBe("no_responders");
    expect(performance.now() - t0).toBeLessThan(1000);
    const later = hubClient.request("cmd.board.update", "cmd", { v: 2 }, { timeoutMs: 20_000, durable: true });
    board = await runAgent(join(dir, "board"), ["--config", boardCfg]);
    const sub = responder(board);
    const reply = await later;
    expect(reply.payload).toEqual({ did: "cmd.board.update", with: { v: 2 } });
    sub.stop();
    await sub.done;
  }, 60_000);

  test("board -> hub -> board: a service on the hub answers a board's request; with the hub gone the board says unreachable", async () => {
    const sub = hubClient.subscribe("t.ask", "svc", async (msg) => {
      if (msg.replyTo) await hubClient.reply(msg, "answer", { from: "hub", to: msg.origin });
    });
    const boardClient = new LocalClient({ socket: board.socket });
    await waitFor(() => linkOpen(board), "the board's link open", 20_000, 50);
    const reply = await boardClient.request("t.ask", "q", {}, { timeoutMs: 5000 });
    expect(reply).toMatchObject({ type: "answer", origin: "hub", payload: { from: "hub", to: "board" } });
    sub.stop();
    await sub.done;
    hub.child.proc.kill("SIGTERM");
    await hub.child.proc.exited;
    await waitFor(async () => !(await linkOpen(board)), "the board's link down", 10_000, 50);
    const err = await boardClient.request("t.ask", "q", {}, { timeoutMs: 5000 }).catch((e) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect(err.code).toBe("unreachable");
    expect(err.status).toBe(503);
  }, 60_000);
});
