import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { freePort, tmpDir, waitFor } from "../helpers.ts";
import { cli, runAgent, type AgentProc } from "./agent-process.ts";
import { FaultProxy } from "./fault-proxy.ts";
import { FrameDecoder } from "../../src/federation/frame.ts";
import { helloFrame, parseClose } from "../../src/federation/messages.ts";

const api = (a: AgentProc, method: string, path: string, body?: unknown) =>
  fetch(`http://k${path}`, { method, body: body === undefined ? undefined : JSON.stringify(body), headers: { "content-type": "application/json" }, unix: a.socket } as RequestInit).then(
    (r) => r.json() as Promise<any>,
  );

/** Pulls and acks on `a` until `n` messages of `channel` came, or the deadline passes. */
async function collect(a: AgentProc, channel: string, sub: string, n: number, timeoutMs: number): Promise<any[]> {
  const got: any[] = [];
  await waitFor(
    async () => {
      const r = await api(a, "GET", `/v1/channels/${channel}/messages?subscriber=${sub}&from=earliest&max=10000&wait=1000`);
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

let dir: string;
let port: number;
let hub: AgentProc, devA: AgentProc, devB: AgentProc, relay: AgentProc, devC: AgentProc, devD: AgentProc;
let proxy: FaultProxy;
let relayPort: number;

/** SHA-256 fingerprint of the certificate the hub presents to a new connection. */
async function hubFingerprint(): Promise<string> {
  const pki = join(dir, "pki");
  const ca = await Bun.file(join(pki, "ca.crt")).text();
  return new Promise((resolve, reject) => {
    Bun.connect({
      hostname: "127.0.0.1",
      port,
      tls: { ca, cert: Bun.file(join(pki, "devB.crt")), key: Bun.file(join(pki, "devB.key")), rejectUnauthorized: false },
      socket: {
        handshake(s) {
          const fp = s.getPeerX509Certificate()?.fingerprint256 ?? "";
          s.end();
          resolve(fp);
        },
        data() {},
        error: (_s, e) => reject(e),
      },
    }).catch(reject);
  });
}

beforeAll(async () => {
  dir = tmpDir();
  const pki = join(dir, "pki");
  expect((await cli(["cert", "ca", "--out-dir", pki])).code).toBe(0);
  for (const n of ["hub", "devA", "devB", "relay", "devC", "devD", "raw", "stranger", "late"])
    expect((await cli(["cert", "issue", "--name", n, "--ca-dir", pki, "--out-dir", pki, "--ip", "127.0.0.1"])).code).toBe(0);
  port = freePort();
  const tls = (n: string) => `tls:\n  cert: ${pki}/${n}.crt\n  key: ${pki}/${n}.key\n  ca: ${pki}/ca.crt\n`;
  const fed = "federation:\n  heartbeat_ms: 500ms\n  reconnect_base_ms: 100ms\n  reconnect_max_ms: 1s\n";
  const cfg = (n: string, body: string) => {
    const f = join(dir, `${n}.yaml`);
    writeFileSync(f, tls(n) + fed + `audit:\n  path: ${dir}/${n}-audit.log\n` + body);
    return f;
  };
  const hubCfg = cfg(
    "hub",
    `hub:\n  listen: 127.0.0.1:${port}\n  peers:\n    - name: devA\n      publish: ["t.>"]\n      subscribe: ["cmd.devA.>"]\n    - name: devB\n      publish: []\n      subscribe: ["t.>"]\n    - name: relay\n      publish: ["chain.>"]\n      subscribe: []\n    - name: devD\n      publish: ["t.>"]\n      subscribe: []\n    - name: raw\n      publish: []\n      subscribe: []\n    - name: late\n      publish: []\n      subscribe: ["cmd.late.>"]\n`,
  );
  const aCfg = cfg("devA", `links:\n  - hub: 127.0.0.1:${port}\n    publish: ["t.>", "secret.>"]\n    subscribe: ["cmd.devA.>"]\n    start: earliest\n`);
  const bCfg = cfg("devB", `links:\n  - hub: 127.0.0.1:${port}\n    publish: []\n    subscribe: ["t.>"]\n`);
  relayPort = freePort();
  const relayCfg = cfg(
    "relay",
    `hub:\n  listen: 127.0.0.1:${relayPort}\n  peers:\n    - name: devC\n      publish: ["chain.>"]\n      subscribe: []\nlinks:\n  - hub: 127.0.0.1:${port}\n    publish: ["chain.>"]\n    subscribe: []\n`,
  );
  const cCfg = cfg("devC", `links:\n  - hub: 127.0.0.1:${relayPort}\n    publish: ["chain.>"]\n    subscribe: []\n`);
  hub = await runAgent(join(dir, "hub"), ["--config", hubCfg]);
  devA = await runAgent(join(dir, "devA"), ["--config", aCfg]);
  devB = await runAgent(join(dir, "devB"), ["--config", bCfg]);
  relay = await runAgent(join(dir, "relay"), ["--config", relayCfg]);
  devC = await runAgent(join(dir, "devC"), ["--config", cCfg]);
  proxy = new FaultProxy(port);
  devD = await runAgent(join(dir, "devD"), ["--config", cfg("devD", `links:\n  - hub: 127.0.0.1:${proxy.port}\n    publish: ["t.>"]\n    subscribe: []\n`)]);
  await waitFor(
    async () => {
      const st = await api(hub, "GET", "/v1/status");
      return st.links.filter((l: any) => l.kind === "peer" && l.state === "open").length === 4;
    },
    "devices A, B, D and the relay connected to the hub",
    20_000,
  );
}, 60_000);

afterAll(async () => {
  proxy?.stop();
  for (const a of [devD, devC, relay, devA, devB, hub]) {
    a?.child.proc.kill("SIGTERM");
    await a?.child.proc.exited;
  }
});

describe("federation between keyop run processes", () => {
  test("device A -> hub -> device B: route [devA, hub, devB], origin devA", async () => {
    const r = await api(devA, "POST", "/v1/channels/t.temp/messages", { type: "reading", payload: { c: 21 } });
    expect(r.seq).toBe(1);
    const got = await api(devB, "GET", "/v1/channels/t.temp/messages?subscriber=s&from=earliest&wait=10000");
    expect(got.messages).toHaveLength(1);
    expect(got.messages[0]).toMatchObject({ id: r.id, channel: "t.temp", origin: "devA", route: ["devA", "hub", "devB"], payload: { c: 21 } });
  }, 30_000);

  test("three hops: device -> relay -> hub", async () => {
    await waitFor(async () => (await api(devC, "GET", "/v1/status")).links[0]?.state === "open", "devC linked to the relay");
    const r = await api(devC, "POST", "/v1/channels/chain.x/messages", { type: "n", payload: "hop" });
    const got = await api(hub, "GET", "/v1/channels/chain.x/messages?subscriber=s&from=earliest&wait=10000");
    expect(got.messages[0]).toMatchObject({ id: r.id, origin: "devC", route: ["devC", "relay", "hub"], payload: "hop" });
  }, 30_000);

  test("hub -> device command, and the link state in status", async () => {
    const r = await api(hub, "POST", "/v1/channels/cmd.devA.reboot/messages", { type: "cmd", payload: { now: true } });
    const got = await api(devA, "GET", "/v1/channels/cmd.devA.reboot/messages?subscriber=s&from=earliest&wait=10000");
    expect(got.messages[0]).toMatchObject({ id: r.id, origin: "hub", route: ["hub", "devA"] });
    const st = await api(devA, "GET", "/v1/status");
    expect(st.links[0]).toMatchObject({ kind: "link", state: "open", peer: "hub" });
    // devB was never sent devA's commands: its link asks for t.> only and the hub allows it t.> only.
    expect((await api(devB, "GET", "/v1/channels")).channels.map((c: any) => c.channel)).not.toContain("cmd.devA.reboot");
  }, 30_000);

  test("a new link with start: earliest also gets what the hub stored for it before its first connection", async () => {
    const before = [];
    for (let i = 0; i < 3; i++) before.push((await api(hub, "POST", "/v1/channels/cmd.late.set/messages", { type: "cmd", payload: i })).id);
    const pki = join(dir, "pki");
    const f = join(dir, "late.yaml");
    writeFileSync(
      f,
      `tls:\n  cert: ${pki}/late.crt\n  key: ${pki}/late.key\n  ca: ${pki}/ca.crt\nlinks:\n  - hub: 127.0.0.1:${port}\n    publish: []\n    subscribe: ["cmd.late.>"]\n    start: earliest\n`,
    );
    const late = await runAgent(join(dir, "late"), ["--config", f]);
    try {
      const got = await collect(late, "cmd.late.set", "s", 3, 15_000);
      expect(got.map((m) => m.id)).toEqual(before);
    } finally {
      late.child.proc.kill("SIGTERM");
      await late.child.proc.exited;
    }
  }, 60_000);

  test("a channel outside devA's publish rules is dropped at the hub and audited", async () => {
    await api(devA, "POST", "/v1/channels/secret.plans/messages", { type: "t", payload: 1 });
    await waitFor(
      async () =>
        (
          await Bun.file(join(dir, "hub-audit.log"))
            .text()
            .catch(() => "")
        ).includes('"event":"policy_violation"'),
      "policy violation audited",
      10_000,
    );
    expect((await api(hub, "GET", "/v1/channels")).channels.map((c: any) => c.channel)).not.toContain("secret.plans");
  }, 30_000);

  test("a raw TLS client: an unknown CN is refused and audited; a known one sending garbage is cut off and audited; other links carry on", async () => {
    const pki = join(dir, "pki");
    /** Connects with `name`'s certificate, writes `bytes`, resolves with what came back once the hub closed. */
    const rawClient = (name: string, bytes: Uint8Array) =>
      new Promise<Uint8Array>((resolve, reject) => {
        const got: Uint8Array[] = [];
        const timer = setTimeout(() => reject(new Error(`hub did not close the ${name} connection`)), 10_000);
        Bun.connect({
          hostname: "127.0.0.1",
          port,
          tls: { ca: Bun.file(join(pki, "ca.crt")), cert: Bun.file(join(pki, `${name}.crt`)), key: Bun.file(join(pki, `${name}.key`)), serverName: "127.0.0.1" },
          socket: {
            open: (sock) => void sock.write(bytes),
            data: (_sock, d) => void got.push(new Uint8Array(d)),
            close: () => {
              clearTimeout(timer);
              resolve(Buffer.concat(got));
            },
            error: () => {},
          },
        }).catch(reject);
      });
    const hello = helloFrame({ versions: [1], name: "x", mode: "link", publish: [], subscribe: [], heartbeatMs: 10_000, maxBatchBytes: 1 << 20 });
    // Refused right after the TLS handshake, before a frame is read; told why in a CLOSE frame.
    const refusal = parseClose(new FrameDecoder(1 << 16).push(await rawClient("stranger", hello))[0]!);
    expect(refusal).toEqual({ code: "unknown_peer", reason: 'unknown peer "stranger" (not in hub.peers)' });
    await rawClient("raw", new TextEncoder().encode("GET / HTTP/1.1\r\nHost: hub\r\n\r\n".repeat(10)));
    const audit = async () =>
      (await Bun.file(join(dir, "hub-audit.log")).text())
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l));
    await waitFor(async () => (await audit()).some((e) => e.event === "malformed_frame" && e.peer === "raw"), "garbage audited");
    const events = await audit();
    expect(events.some((e) => e.event === "peer_rejected" && String(e.reason).includes('unknown peer "stranger"'))).toBe(true);
    // Everyone else is still connected and messages still flow A -> hub -> B.
    const st = await api(hub, "GET", "/v1/status");
    expect(
      st.links
        .filter((l: any) => l.kind === "peer" && l.state === "open")
        .map((l: any) => l.peer)
        .sort(),
    ).toEqual(["devA", "devB", "devD", "relay"]);
    const r = await api(devA, "POST", "/v1/channels/t.after-garbage/messages", { type: "n", payload: 1 });
    const got = await api(devB, "GET", "/v1/channels/t.after-garbage/messages?subscriber=s&from=earliest&wait=10000");
    expect(got.messages[0]?.id).toBe(r.id);
  }, 60_000);

  test("hub down while A publishes 10,000 messages; hub back: every one arrives at B once, in order", async () => {
    hub.child.proc.kill("SIGTERM");
    await hub.child.proc.exited;
    await waitFor(async () => (await api(devA, "GET", "/v1/status")).links[0]?.state !== "open", "devA sees the hub gone");
    const ids: string[] = [];
    for (let b = 0; b < 10; b++) {
      const body = Array.from({ length: 1000 }, (_, i) => JSON.stringify({ type: "n", payload: b * 1000 + i })).join("\n");
      const r = (await fetch("http://k/v1/channels/t.offline/messages", { method: "POST", body, headers: { "content-type": "application/x-ndjson" }, unix: devA.socket } as RequestInit).then((x) =>
        x.json(),
      )) as { results: { id: string }[] };
      ids.push(...r.results.map((x) => x.id));
    }
    // While the hub is down, the link's status says what waits for it.
    const before = Date.now();
    const link = (await api(devA, "GET", "/v1/status")).links[0];
    const waiting = link.backlog;
    // Nothing of the channel is acknowledged, so the backlog's bytes are the whole log's.
    const stored = (await api(devA, "GET", "/v1/channels")).channels.find((c: any) => c.channel === "t.offline");
    expect(stored.bytes).toBeGreaterThan(10_000 * 50);
    const entry = waiting.find((b: any) => b.channel === "t.offline");
    expect(entry).toMatchObject({ messages: 10_000, bytes: stored.bytes });
    // The age of the oldest message waiting: the first of the batch, published before `before`.
    const firstTs = (await api(devA, "GET", "/v1/channels/t.offline/messages?subscriber=age&from=earliest&max=1")).messages[0].ts;
    expect(entry.oldest_age_ms).toBeGreaterThanOrEqual(before - firstTs);
    expect(entry.oldest_age_ms).toBeLessThan(Date.now() - firstTs + 1);
    expect(link.lane_backlog).toContainEqual({ priority: 4, messages: 10_000, oldest_age_ms: expect.any(Number) });
    hub = await runAgent(join(dir, "hub"), ["--config", join(dir, "hub.yaml")]);
    const got = await collect(devB, "t.offline", "o", 10_000, 60_000);
    expect(got.length).toBe(10_000);
    expect(got.map((m) => m.id)).toEqual(ids);
    expect(got.map((m) => m.payload)).toEqual(Array.from({ length: 10_000 }, (_, i) => i));
    await waitFor(async () => ((await api(devA, "GET", "/v1/status")).links[0].backlog.find((b: any) => b.channel === "t.offline")?.messages ?? 0) === 0, "backlog drained");
    const metrics = await (await fetch("http://k/metrics", { unix: devA.socket } as RequestInit)).text();
    expect(metrics).toContain(`keyop_link_up{kind="link",target="127.0.0.1:${port}"} 1`);
    expect(metrics).toMatch(new RegExp(`keyop_link_reconnects\\{kind="link",target="127.0.0.1:${port}"\\} [1-9]`));
    expect(metrics).toContain(`keyop_federation_backlog_messages{kind="link",target="127.0.0.1:${port}",peer="hub",channel="t.offline"} 0`);
    expect(metrics).toContain(`keyop_federation_backlog_bytes{kind="link",target="127.0.0.1:${port}",peer="hub",channel="t.offline"} 0`);
  }, 60_000);

  test("SIGHUP: after the files are replaced, a new connection presents the new certificate; links stay up", async () => {
    const before = await hubFingerprint();
    const reconnectsBefore = (await api(devA, "GET", "/v1/status")).links[0].reconnects;
    const pki = join(dir, "pki");
    expect((await cli(["cert", "issue", "--name", "hub", "--ca-dir", pki, "--out-dir", pki, "--ip", "127.0.0.1", "--days", "100", "--force"])).code).toBe(0);
    hub.child.proc.kill("SIGHUP");
    await waitFor(async () => (await api(hub, "GET", "/v1/status")).tls.cert_days_left === 99, "hub reloaded its certificate");
    const after = await hubFingerprint();
    expect(after).not.toBe(before);
    // the device links did not drop: a message still crosses A -> hub -> B
    const r = await api(devA, "POST", "/v1/channels/t.after-reload/messages", { type: "n", payload: 1 });
    const got = await api(devB, "GET", "/v1/channels/t.after-reload/messages?subscriber=s&from=earliest&wait=10000");
    expect(got.messages[0]?.id).toBe(r.id);
    expect((await api(devA, "GET", "/v1/status")).links[0]).toMatchObject({ state: "open", reconnects: reconnectsBefore });
  }, 30_000);

  test("a link cut mid-batch many times loses nothing and stores nothing twice", async () => {
    const ids: string[] = [];
    const publishing = (async () => {
      for (let b = 0; b < 20; b++) {
        const body = Array.from({ length: 250 }, (_, i) => JSON.stringify({ type: "n", payload: b * 250 + i })).join("\n");
        const r = (await fetch("http://k/v1/channels/t.faults/messages", { method: "POST", body, headers: { "content-type": "application/x-ndjson" }, unix: devD.socket } as RequestInit).then((x) =>
          x.json(),
        )) as { results: { id: string }[] };
        ids.push(...r.results.map((x) => x.id));
        await Bun.sleep(20);
      }
    })();
    // Cut every connection through the proxy again and again while batches are in flight.
    while (proxy.cuts < 15) {
      await Bun.sleep(60);
      proxy.cut();
    }
    await publishing;
    const got = await collect(devB, "t.faults", "f", 5000, 60_000);
    expect(got.map((m) => m.id)).toEqual(ids);
    expect(new Set(got.map((m) => m.id)).size).toBe(5000);
  }, 90_000);

  test("a blackholed link (no FIN) is noticed within three heartbeats, and catches up once the path is back", async () => {
    await waitFor(async () => (await api(devD, "GET", "/v1/status")).links[0]?.state === "open", "devD linked");
    proxy.blackholed = true;
    const t0 = Date.now();
    const r = await api(devD, "POST", "/v1/channels/t.blackhole/messages", { type: "n", payload: "during" });
    await waitFor(async () => (await api(devD, "GET", "/v1/status")).links[0]?.state !== "open", "devD notices the dead link", 10_000, 20);
    const noticed = Date.now() - t0;
    expect(noticed).toBeLessThan(3 * 500 + 500 + 1000); // 3 heartbeats of 500 ms, the check period, slack
    expect((await api(devD, "GET", "/v1/status")).links[0].last_error).toContain("heartbeat");
    proxy.blackholed = false;
    proxy.cut(); // the old, silent connections go; the link reconnects through the healthy path
    const got = await api(devB, "GET", "/v1/channels/t.blackhole/messages?subscriber=s&from=earliest&wait=15000");
    expect(got.messages[0]?.id).toBe(r.id);
  }, 60_000);
});
