import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { tmpDir, waitFor } from "../helpers.ts";
import { cli, runAgent, type AgentProc } from "./agent-process.ts";

/** A free loopback port (bound and released; fine on a test machine). */
function freePort(): number {
  const l = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const p = l.port;
  l.stop(true);
  return p;
}

const api = (a: AgentProc, method: string, path: string, body?: unknown) =>
  fetch(`http://k${path}`, { method, body: body === undefined ? undefined : JSON.stringify(body), headers: { "content-type": "application/json" }, unix: a.socket } as RequestInit).then((r) => r.json() as Promise<any>);

let dir: string;
let port: number;
let hub: AgentProc, devA: AgentProc, devB: AgentProc;

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
  for (const n of ["hub", "devA", "devB"]) expect((await cli(["cert", "issue", "--name", n, "--ca-dir", pki, "--out-dir", pki, "--ip", "127.0.0.1"])).code).toBe(0);
  port = freePort();
  const tls = (n: string) => `tls:\n  cert: ${pki}/${n}.crt\n  key: ${pki}/${n}.key\n  ca: ${pki}/ca.crt\n`;
  const fed = "federation:\n  heartbeat_ms: 500ms\n  reconnect_base_ms: 100ms\n  reconnect_max_ms: 1s\n";
  const cfg = (n: string, body: string) => {
    const f = join(dir, `${n}.yaml`);
    writeFileSync(f, tls(n) + fed + `audit:\n  path: ${dir}/${n}-audit.log\n` + body);
    return f;
  };
  const hubCfg = cfg("hub", `hub:\n  listen: 127.0.0.1:${port}\n  peers:\n    - name: devA\n      publish: ["t.>"]\n      subscribe: ["cmd.devA.>"]\n    - name: devB\n      publish: []\n      subscribe: ["t.>"]\n`);
  const aCfg = cfg("devA", `links:\n  - hub: 127.0.0.1:${port}\n    publish: ["t.>", "secret.>"]\n    subscribe: ["cmd.devA.>"]\n    start: earliest\n`);
  const bCfg = cfg("devB", `links:\n  - hub: 127.0.0.1:${port}\n    publish: []\n    subscribe: ["t.>"]\n`);
  hub = await runAgent(join(dir, "hub"), ["--config", hubCfg]);
  devA = await runAgent(join(dir, "devA"), ["--config", aCfg]);
  devB = await runAgent(join(dir, "devB"), ["--config", bCfg]);
  await waitFor(async () => {
    const st = await api(hub, "GET", "/v1/status");
    return st.links.filter((l: any) => l.kind === "peer" && l.state === "open").length === 2;
  }, "both devices connected to the hub", 20_000);
}, 60_000);

afterAll(async () => {
  for (const a of [devA, devB, hub]) {
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

  test("hub -> device command, and the link state in status", async () => {
    const r = await api(hub, "POST", "/v1/channels/cmd.devA.reboot/messages", { type: "cmd", payload: { now: true } });
    const got = await api(devA, "GET", "/v1/channels/cmd.devA.reboot/messages?subscriber=s&from=earliest&wait=10000");
    expect(got.messages[0]).toMatchObject({ id: r.id, origin: "hub", route: ["hub", "devA"] });
    const st = await api(devA, "GET", "/v1/status");
    expect(st.links[0]).toMatchObject({ kind: "link", state: "open", peer: "hub" });
    // devB was never sent devA's commands: its link asks for t.> only and the hub allows it t.> only.
    expect((await api(devB, "GET", "/v1/channels")).channels.map((c: any) => c.channel)).not.toContain("cmd.devA.reboot");
  }, 30_000);

  test("a channel outside devA's publish rules is dropped at the hub and audited", async () => {
    await api(devA, "POST", "/v1/channels/secret.plans/messages", { type: "t", payload: 1 });
    await waitFor(async () => (await Bun.file(join(dir, "hub-audit.log")).text().catch(() => "")).includes('"event":"policy_violation"'), "policy violation audited", 10_000);
    expect((await api(hub, "GET", "/v1/channels")).channels.map((c: any) => c.channel)).not.toContain("secret.plans");
  }, 30_000);

  test("hub down while A publishes; hub back: everything arrives at B once, in order", async () => {
    hub.child.proc.kill("SIGTERM");
    await hub.child.proc.exited;
    const ids: string[] = [];
    for (let i = 0; i < 300; i++) ids.push((await api(devA, "POST", "/v1/channels/t.offline/messages", { type: "n", payload: i })).id);
    hub = await runAgent(join(dir, "hub"), ["--config", join(dir, "hub.yaml")]);
    const got: any[] = [];
    await waitFor(async () => {
      const r = await api(devB, "GET", `/v1/channels/t.offline/messages?subscriber=o&from=earliest&max=1000&wait=1000`);
      if (r.messages?.length) {
        got.push(...r.messages);
        await api(devB, "POST", "/v1/channels/t.offline/subscribers/o/ack", { seq: r.messages.at(-1).seq });
      }
      return got.length >= 300;
    }, "300 offline messages at B", 30_000);
    expect(got.map((m) => m.id)).toEqual(ids);
    expect(new Set(got.map((m) => m.id)).size).toBe(300);
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
});

