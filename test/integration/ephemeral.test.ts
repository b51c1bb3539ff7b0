import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { EphemeralMessenger, type Message } from "../../src/index.ts";
import { KeyopError } from "../../src/errors.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { Messenger } from "../../src/messenger/messenger.ts";
import { freePort, tmpDir, waitFor } from "../helpers.ts";
import { cli, runAgent, type AgentProc } from "./agent-process.ts";
import { FaultProxy } from "./fault-proxy.ts";

const api = (a: AgentProc, method: string, path: string, body?: unknown) =>
  fetch(`http://k${path}`, { method, body: body === undefined ? undefined : JSON.stringify(body), headers: { "content-type": "application/json" }, unix: a.socket } as RequestInit).then(
    (r) => r.json() as Promise<any>,
  );

let dir: string;
let pki: string;
let port: number;
let hub: AgentProc;
let hubCfg: string;
const open: EphemeralMessenger[] = [];

const files = (name: string) => ({ cert: join(pki, `${name}.crt`), key: join(pki, `${name}.key`), ca: join(pki, "ca.crt") });

/** An ephemeral client closed after the file. */
function client(name: string, extra: Partial<ConstructorParameters<typeof EphemeralMessenger>[0]> = {}, target = `127.0.0.1:${port}`): EphemeralMessenger {
  const em = new EphemeralMessenger({ hub: target, tls: files(name), logger: silentLogger, reconnectBaseMs: 100, reconnectMaxMs: 500, heartbeatMs: 500, ...extra });
  open.push(em);
  return em;
}

async function startHub(): Promise<void> {
  hub = await runAgent(join(dir, "hub"), ["--config", hubCfg]);
}

async function stopHub(signal: "SIGTERM" | "SIGKILL" = "SIGTERM"): Promise<void> {
  hub.child.proc.kill(signal);
  await hub.child.proc.exited;
}

beforeAll(async () => {
  dir = tmpDir();
  pki = join(dir, "pki");
  expect((await cli(["cert", "ca", "--out-dir", pki])).code).toBe(0);
  for (const n of ["hub", "svc", "dash", "stranger"]) expect((await cli(["cert", "issue", "--name", n, "--ca-dir", pki, "--out-dir", pki, "--ip", "127.0.0.1"])).code).toBe(0);
  port = freePort();
  hubCfg = join(dir, "hub.yaml");
  writeFileSync(
    hubCfg,
    `tls:\n  cert: ${pki}/hub.crt\n  key: ${pki}/hub.key\n  ca: ${pki}/ca.crt\nfederation:\n  heartbeat_ms: 500ms\naudit:\n  path: ${dir}/audit.log\n` +
      `hub:\n  listen: 127.0.0.1:${port}\n  peers:\n    - name: svc\n      publish: ["orders.>", "live.>"]\n      subscribe: ["live.>"]\n    - name: dash\n      publish: []\n      subscribe: ["live.>"]\n`,
  );
  await startHub();
}, 60_000);

afterAll(async () => {
  for (const em of open) await em.close().catch(() => {});
  hub.child.proc.kill("SIGTERM");
  await hub.child.proc.exited;
});

describe("EphemeralMessenger against a keyop hub process", () => {
  test("the same bad input gets the same error code from the ephemeral and the durable messenger", async () => {
    const em = client("svc", { maxBatchBytes: 3048 });
    await em.connect();
    // The ephemeral client's limit is what fits a batch (3,048 - 1,024 bytes); the durable one gets the same.
    const m = await Messenger.open({ storage: { dataDir: join(dir, "same-errors") }, maxMessageBytes: 2024, logger: silentLogger });
    const cases: [string, string, unknown, { correlationId?: string; serviceName?: string }?][] = [
      ["bad..name", "t", 1],
      ["../etc", "t", 1],
      ["orders.dead-letter", "t", 1],
      ["orders.x", "", 1],
      ["orders.x", "t".repeat(300), 1],
      ["orders.x", "t", "x".repeat(2100)],
      ["orders.x", "t", { s: Symbol("x") }],
      ["orders.x", "t", 1, { correlationId: "" }],
      ["orders.x", "t", 1, { serviceName: "s".repeat(300) }],
      ["orders.x", "t", JSON.parse("[".repeat(65) + "]".repeat(65))],
    ];
    const codeOf = (p: () => Promise<unknown>) =>
      p().then(
        () => "ok",
        (e) => (e as KeyopError).code,
      );
    const got: [string, string, string][] = [];
    for (const [ch, type, payload, opts] of cases) got.push([ch, await codeOf(() => m.publish(ch, type, payload, opts)), await codeOf(() => em.publish(ch, type, payload, opts))]);
    expect(got).toEqual(cases.map(([ch], i) => [ch, got[i]![1], got[i]![1]]));
    expect(got.map((g) => g[1])).toEqual([
      "invalid_channel",
      "invalid_channel",
      "reserved_channel",
      "invalid_argument",
      "invalid_argument",
      "too_large",
      "invalid_argument",
      "invalid_argument",
      "invalid_argument",
      "invalid_argument",
    ]);
    await m.close();
    await em.close();
  });

  test("publish resolves once the hub stored the message: origin and route name the client", async () => {
    const em = client("svc");
    await em.connect();
    expect(em.name).toBe("svc");
    const results = await Promise.all(Array.from({ length: 50 }, (_, i) => em.publish("orders.new", "order", { n: i }, { correlationId: "c-1" })));
    const stored = await api(hub, "GET", "/v1/channels/orders.new/messages?subscriber=check&from=earliest&max=100");
    expect(stored.messages.map((m: any) => m.id)).toEqual(results.map((r) => r.id));
    expect(stored.messages[0]).toMatchObject({ origin: "svc", route: ["svc", "hub"], type: "order", correlation_id: "c-1", payload: { n: 0 } });
    // Outside the hub's rules for svc: refused here, typed, before anything is sent.
    const err = await em.publish("secret.x", "t", 1).catch((e) => e);
    expect(err).toBeInstanceOf(KeyopError);
    expect(err.code).toBe("forbidden");
    await em.close();
  });

  test("live subscribe: no echo of its own publishes, nothing replayed after a reconnect, no cursor file at the hub", async () => {
    const got: Message[] = [];
    const proxy = new FaultProxy(port);
    const dash = client("dash", { subscribe: ["live.>"], autoReconnect: true }, `127.0.0.1:${proxy.port}`);
    dash.subscribe("live.>", (m) => void got.push(m));
    await dash.connect();
    const svc = client("svc", { subscribe: ["live.>"] });
    const svcGot: Message[] = [];
    svc.subscribe("live.>", (m) => void svcGot.push(m));
    await svc.connect();
    const first = await svc.publish("live.temp", "t", 1);
    await waitFor(() => got.some((m) => m.id === first.id), "dash gets the live message");
    // Nothing is stored at an ephemeral client, so its name is not added to the route.
    expect(got[0]).toMatchObject({ channel: "live.temp", origin: "svc", route: ["svc", "hub"], payload: 1 });
    // A message from elsewhere after svc's own: when it has arrived at svc, svc's own would have come before it.
    const marker = await api(hub, "POST", "/v1/channels/live.temp/messages", { type: "marker", payload: 0 });
    await waitFor(() => svcGot.some((m) => m.id === marker.id), "svc gets the hub's marker");
    expect(svcGot.map((m) => m.id)).toEqual([marker.id]);
    // No cursor of either ephemeral peer is kept at the hub.
    expect(readdirSync(join(hub.dataDir, "subscribers")).filter((f) => f.includes("svc") || f.includes("dash") || f.includes("_eph"))).toEqual([]);
    expect(
      (await api(hub, "GET", "/v1/status")).links
        .filter((l: any) => l.kind === "ephemeral")
        .map((l: any) => l.peer)
        .sort(),
    ).toEqual(["dash", "svc"]);
    await svc.close();

    // The hub restarts; what is published while dash is away is never delivered to it. Dash's
    // path is held (blackholed) until that publish is stored, so it cannot be back before it.
    proxy.blackholed = true;
    await stopHub();
    await waitFor(() => !dash.connected, "dash notices the hub is gone");
    await startHub();
    const missed = await api(hub, "POST", "/v1/channels/live.temp/messages", { type: "while-away", payload: 1 });
    expect(dash.connected).toBe(false);
    proxy.heal();
    await waitFor(() => dash.connected, "dash reconnects by itself", 15_000);
    const after = await api(hub, "POST", "/v1/channels/live.temp/messages", { type: "after", payload: 2 });
    await waitFor(() => got.some((m) => m.id === after.id), "dash gets what came after the reconnect");
    expect(got.some((m) => m.id === missed.id)).toBe(false);
    expect(dash.connects).toBe(2);
    expect(readdirSync(join(hub.dataDir, "subscribers")).filter((f) => f.includes("dash") || f.includes("_eph"))).toEqual([]);
    await dash.close();
    proxy.stop();
  }, 60_000);

  test("the hub killed mid-publish: unacknowledged publishes reject with conn_lost; with autoReconnect later ones go through", async () => {
    const proxy = new FaultProxy(port);
    try {
      const em = client("svc", { autoReconnect: true }, `127.0.0.1:${proxy.port}`);
      await em.connect();
      await em.publish("orders.new", "order", "before");
      // The path goes silent: these are sent and never acknowledged; then the hub dies.
      proxy.blackholed = true;
      const pending = Array.from({ length: 20 }, (_, i) =>
        em.publish("orders.new", "order", { lost: i }).then(
          (r) => r,
          (e) => e,
        ),
      );
      await Bun.sleep(50);
      await stopHub("SIGKILL");
      proxy.cut();
      proxy.blackholed = false;
      const outcomes = await Promise.all(pending);
      expect(outcomes.every((o) => o instanceof KeyopError && o.code === "conn_lost")).toBe(true);
      await startHub();
      const r = await em.publish("orders.new", "order", "after restart");
      const stored = await api(hub, "GET", "/v1/channels/orders.new/messages?subscriber=after&from=earliest&max=1000");
      expect(stored.messages.some((m: any) => m.id === r.id)).toBe(true);
    } finally {
      proxy.stop();
    }
  }, 60_000);

  test("without autoReconnect a dropped connection fails what is queued with not_connected", async () => {
    const em = client("svc");
    await em.connect();
    await stopHub();
    await waitFor(() => !em.connected, "the drop is noticed");
    const err = await em.publish("orders.new", "order", 1).catch((e) => e);
    expect(err.code).toBe("not_connected");
    await startHub();
  }, 30_000);

  test("a full queue makes publish wait; its AbortSignal gives up; close() fails what is still queued", async () => {
    // Nothing listens there: connect keeps retrying in the background and nothing is sent.
    const em = client("svc", { autoReconnect: true, queueSize: 2 }, `127.0.0.1:${freePort()}`);
    const connecting = em.connect().catch((e) => e);
    await waitFor(() => {
      try {
        return em.name === "svc";
      } catch {
        return false;
      }
    }, "certificate loaded");
    const queued = [em.publish("orders.new", "o", 1).catch((e) => e), em.publish("orders.new", "o", 2).catch((e) => e)];
    const ctl = new AbortController();
    const waiting = em.publish("orders.new", "o", 3, { signal: ctl.signal }).catch((e) => e);
    ctl.abort();
    expect((await waiting).code).toBe("aborted");
    await em.close();
    expect((await Promise.all(queued)).map((e) => e.code)).toEqual(["closed", "closed"]);
    expect((await connecting).code).toBe("closed");
  });

  test("a certificate the hub does not allow: connect rejects with peer_rejected, onFatal is called, no retries", async () => {
    const fatal: KeyopError[] = [];
    const em = client("stranger", { autoReconnect: true, onFatal: (e) => fatal.push(e) });
    const err = await em.connect().catch((e) => e);
    expect(err).toBeInstanceOf(KeyopError);
    expect(err.code).toBe("peer_rejected");
    expect(err.message).toContain("unknown_peer");
    expect(fatal.map((e) => e.code)).toEqual(["peer_rejected"]);
    expect(em.connects).toBe(0);
    await waitFor(async () => (await Bun.file(join(dir, "audit.log")).text()).includes('unknown peer \\"stranger\\"'), "refusal audited");
  }, 30_000);
});
