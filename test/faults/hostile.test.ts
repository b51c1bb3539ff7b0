/**
 * Fault scenario 5: hostile input against a running agent that is also a
 * hub. Hand-picked bad requests (bad JSON, deep nesting, huge bodies,
 * traversal-shaped and invalid channel names, invalid UTF-8, wrong content
 * types) each get a clear 4xx; random and mutated requests never get a 5xx
 * nor take the process down; 1,000 idle connections on the Unix socket and
 * 1,000 on the hub port stay bounded in memory and do not stop service to
 * others. KEYOP_FAULT_LONG=1 runs 25 times more random requests.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { freePort, tmpDir, waitFor } from "../helpers.ts";
import { cli, runAgent, type AgentProc } from "../integration/agent-process.ts";

const RANDOM = process.env.KEYOP_FAULT_LONG ? 50_000 : 2_000;
let agent: AgentProc;
let port: number;

const rssMB = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))![1]) / 1024;

/** A raw HTTP/1.1 request over the Unix socket; resolves with the status (0: the connection closed without one). */
function raw(bytes: Uint8Array | string): Promise<number> {
  return new Promise((resolve) => {
    let got = "";
    Bun.connect({
      unix: agent.socket,
      socket: {
        open: (s) => void s.write(typeof bytes === "string" ? new TextEncoder().encode(bytes) : bytes),
        data: (s, d) => {
          got += new TextDecoder().decode(d);
          const m = /^HTTP\/1\.1 (\d{3})/.exec(got);
          if (m) {
            resolve(Number(m[1]));
            s.end();
          }
        },
        close: () => resolve(0),
        error: () => resolve(0),
      },
    }).catch(() => resolve(0));
  });
}

const post = (path: string, body: string | Uint8Array, type = "application/json") =>
  fetch(`http://k${path}`, { method: "POST", body, headers: { "content-type": type }, unix: agent.socket } as RequestInit);

beforeAll(async () => {
  const dir = tmpDir();
  const pki = join(dir, "pki");
  expect((await cli(["cert", "ca", "--out-dir", pki])).code).toBe(0);
  expect((await cli(["cert", "issue", "--name", "hub", "--ca-dir", pki, "--out-dir", pki, "--ip", "127.0.0.1"])).code).toBe(0);
  port = freePort();
  writeFileSync(join(dir, "k.yaml"), `tls:\n  cert: ${pki}/hub.crt\n  key: ${pki}/hub.key\n  ca: ${pki}/ca.crt\nhub:\n  listen: 127.0.0.1:${port}\n  peers: []\napi:\n  max_message_bytes: 64KiB\n`);
  agent = await runAgent(join(dir, "a"), ["--config", join(dir, "k.yaml")]);
}, 60_000);

afterAll(async () => {
  agent.child.proc.kill("SIGTERM");
  await agent.child.proc.exited;
});

describe("hostile input against a running agent", () => {
  test("hand-picked bad requests each get a clear 4xx with an error code", async () => {
    const deep = "[".repeat(30_000) + "]".repeat(30_000); // under the 64 KiB limit, far past the 64 levels keyop stores
    const cases: [string, Promise<Response>, number][] = [
      ["bad JSON", post("/v1/channels/h.a/messages", "{nope"), 400],
      ["not an object", post("/v1/channels/h.a/messages", "[1,2]"), 400],
      ["deep nesting", post("/v1/channels/h.a/messages", `{"type":"t","payload":${deep}}`), 400],
      ["nesting just past the limit", post("/v1/channels/h.a/messages", `{"type":"t","payload":${"[".repeat(65)}${"]".repeat(65)}}`), 400],
      ["huge body", post("/v1/channels/h.a/messages", `{"type":"t","payload":"${"x".repeat(2 << 20)}"}`), 413],
      ["traversal name", post("/v1/channels/..%2F..%2Fetc%2Fpasswd/messages", '{"type":"t","payload":1}'), 400],
      ["dot segments", post("/v1/channels/a..b/messages", '{"type":"t","payload":1}'), 400],
      ["slash in name", post("/v1/channels/a%2Fb/messages", '{"type":"t","payload":1}'), 400],
      ["invalid UTF-8 body", post("/v1/channels/h.a/messages", new Uint8Array([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x7d])), 400],
      ["invalid UTF-8 name", post("/v1/channels/h.%FF%FE/messages", '{"type":"t","payload":1}'), 400],
      ["wrong content type", post("/v1/channels/h.a/messages", "<xml/>", "application/xml"), 415],
      ["bad NDJSON line", post("/v1/channels/h.a/messages", '{"type":"t","payload":1}\n{oops\n', "application/x-ndjson"), 400],
      ["msgpack garbage", post("/v1/channels/h.a/messages", new Uint8Array([0xc1, 0xc1, 0xc1]), "application/msgpack"), 400],
      ["bad ack", post("/v1/channels/h.a/subscribers/x/ack", '{"seq":"one"}'), 400],
    ];
    for (const [what, res, status] of cases) {
      const r = await res;
      const body = (await r.json().catch(() => null)) as { error?: { code?: string } } | null;
      expect({ what, status: r.status, coded: typeof body?.error?.code === "string" }).toEqual({ what, status, coded: true });
    }
    // Nothing of that was stored.
    const ch = ((await (await fetch("http://k/v1/channels", { unix: agent.socket } as RequestInit)).json()) as { channels: { channel: string }[] }).channels;
    expect(ch.map((c) => c.channel)).toEqual([]);
  }, 60_000);

  test(`${RANDOM.toLocaleString("en-US")} random and mutated requests: never a 5xx, the process stays up`, async () => {
    let seed = 99;
    const rnd = () => (seed = (seed * 1_103_515_245 + 12_345) & 0x7fffffff) / 0x7fffffff;
    const pick = <T>(xs: T[]) => xs[Math.floor(rnd() * xs.length)]!;
    const bytes = (n: number) => Uint8Array.from({ length: n }, () => Math.floor(rnd() * 256));
    const good = '{"type":"t","payload":{"a":[1,2,{"b":"c"}]}}';
    const mutate = (s: string) => {
      const b = new TextEncoder().encode(s);
      for (let k = 0; k < 1 + Math.floor(rnd() * 4); k++) b[Math.floor(rnd() * b.length)] = Math.floor(rnd() * 256);
      return b;
    };
    const paths = [
      "/v1/channels/h.r/messages",
      "/v1/channels/h.*/messages?subscriber=s&max=5",
      "/v1/channels/h.r/subscribers/s/ack",
      "/v1/channels/%00/messages",
      "/v1/status",
      "/v1/channels/h.r/stream?subscriber=z&max_inflight=-1",
      "/metrics",
      "/v1/channels/h.r/messages?subscriber=" + "s".repeat(300),
    ];
    const types = ["application/json", "application/x-ndjson", "application/msgpack", "text/plain", ""];
    const statuses = new Map<number, number>();
    for (let i = 0; i < RANDOM; i++) {
      const method = pick(["GET", "POST", "POST", "POST", "DELETE", "PUT"]);
      const body = pick([() => mutate(good), () => bytes(Math.floor(rnd() * 300)), () => new TextEncoder().encode(good)])();
      const r = await fetch(`http://k${pick(paths)}`, { method, body: method === "GET" ? undefined : body, headers: { "content-type": pick(types) }, unix: agent.socket } as RequestInit).catch(
        () => null,
      );
      const st = r?.status ?? 0;
      if (r) await r.arrayBuffer().catch(() => {});
      statuses.set(st, (statuses.get(st) ?? 0) + 1);
      expect({ i, status: st >= 500 ? st : "ok" }).toEqual({ i, status: "ok" });
    }
    // Broken HTTP itself: the server answers 400 or just closes.
    for (const junk of ["GARBAGE\r\n\r\n", "POST /v1/channels/h.r/messages HTTP/1.1\r\nContent-Length: -5\r\n\r\n", bytes(200)]) {
      expect([0, 400, 431, 505]).toContain(await raw(junk));
    }
    console.log(
      `random requests: ${[...statuses]
        .sort((a, b) => a[0] - b[0])
        .map(([s, n]) => `${s}: ${n}`)
        .join(", ")}`,
    );
    expect(agent.child.proc.exitCode).toBe(null);
    const ok = await post("/v1/channels/h.after/messages", '{"type":"t","payload":1}');
    expect(ok.status).toBe(201);
  }, 600_000);

  test("1,000 idle connections on the Unix socket and 1,000 on the hub port: memory bounded, others still served", async () => {
    const before = rssMB(agent.child.proc.pid);
    const held: { end(): void }[] = [];
    for (let i = 0; i < 1000; i++) held.push(await Bun.connect({ unix: agent.socket, socket: { data() {} } }));
    for (let i = 0; i < 1000; i++) held.push(await Bun.connect({ hostname: "127.0.0.1", port, socket: { data() {}, error() {} } }));
    // Still served: a publish and a read go through while 2,000 connections sit idle.
    const r = await post("/v1/channels/h.idle/messages", '{"type":"t","payload":"still here"}');
    expect(r.status).toBe(201);
    const got = (await (await fetch("http://k/v1/channels/h.idle/messages?subscriber=s&from=earliest", { unix: agent.socket } as RequestInit)).json()) as { messages: { payload: unknown }[] };
    expect(got.messages.map((m) => m.payload)).toEqual(["still here"]);
    const during = rssMB(agent.child.proc.pid);
    console.log(`idle connections: RSS ${before.toFixed(1)} MB before, ${during.toFixed(1)} MB with 2,000 open`);
    expect(during - before).toBeLessThan(100);
    // Connections that never do a TLS handshake are closed by the hub's handshake deadline.
    for (const h of held) h.end();
    await waitFor(() => agent.child.proc.exitCode === null, "agent alive");
  }, 120_000);
});
