/**
 * Fault scenario 3, across processes: the hub's data directory is a small
 * tmpfs that fills up. Publishing at the hub fails with 507 `disk_full`,
 * reads at the hub keep working, device A keeps what the hub cannot take
 * (the hub does not acknowledge what it could not store), and once space
 * is freed everything reaches device B once and in order. (The library
 * and single-agent cases are in test/store/disk-full.test.ts.) Skipped with
 * the reason printed where tmpfs cannot be mounted.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, unlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort, tmpDir, waitFor } from "../helpers.ts";
import { fleet, runAgent, type AgentProc } from "../integration/agent-process.ts";

const mnt = mkdtempSync(join(tmpdir(), "keyop-fault-tmpfs-"));
const mounted = process.platform === "linux" ? Bun.spawnSync(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt], { stderr: "pipe" }) : null;
const skipReason = !mounted ? "not Linux" : mounted.exitCode !== 0 ? `mount failed: ${mounted.stderr.toString().trim()}` : null;
if (skipReason) console.log(`SKIP disk-full federation test: cannot mount tmpfs (${skipReason})`);
const agents: AgentProc[] = [];

afterAll(async () => {
  for (const a of agents) {
    a.child.proc.kill("SIGTERM");
    await a.child.proc.exited;
  }
  if (!skipReason) Bun.spawnSync(["umount", mnt]);
  rmSync(mnt, { recursive: true, force: true });
});

const api = (a: AgentProc, method: string, path: string, body?: string, type = "application/json") =>
  fetch(`http://k${path}`, { method, body, headers: { "content-type": type }, unix: a.socket } as RequestInit);

describe.skipIf(skipReason !== null)("disk full at the hub", () => {
  test("507 at the hub, reads go on, device A keeps the backlog, all of it arrives once space is back", async () => {
    const dir = tmpDir();
    const tls = await fleet(dir, ["hub", "devA", "devB"]);
    const port = freePort();
    const fed = "federation:\n  heartbeat_ms: 500ms\n  reconnect_base_ms: 50ms\n  reconnect_max_ms: 300ms\n";
    const cfg = (n: string, body: string) => {
      writeFileSync(join(dir, `${n}.yaml`), tls(n) + fed + body);
      return join(dir, `${n}.yaml`);
    };
    const hubDir = join(mnt, "hub");
    mkdirSync(hubDir);
    const hub = await runAgent(hubDir, [
      "--config",
      cfg(
        "hub",
        `storage:\n  segment_bytes: 256KiB\nhub:\n  listen: 127.0.0.1:${port}\n  peers:\n    - name: devA\n      publish: ["d.>"]\n      subscribe: []\n    - name: devB\n      publish: []\n      subscribe: ["d.>"]\n`,
      ),
    ]);
    const devA = await runAgent(join(dir, "devA"), ["--config", cfg("devA", `links:\n  - hub: 127.0.0.1:${port}\n    publish: ["d.>"]\n    subscribe: []\n`)]);
    const devB = await runAgent(join(dir, "devB"), ["--config", cfg("devB", `links:\n  - hub: 127.0.0.1:${port}\n    publish: []\n    subscribe: ["d.>"]\n`)]);
    agents.push(hub, devA, devB);

    const publishOnA = async (n: number, from: number) => {
      const body = Array.from({ length: n }, (_, i) => JSON.stringify({ type: "n", payload: { i: from + i, pad: "q".repeat(400) } })).join("\n");
      const r = await api(devA, "POST", "/v1/channels/d.full/messages", body, "application/x-ndjson");
      expect(r.status).toBe(201);
    };
    const atB: number[] = [];
    const readB = async () => {
      const r = (await (await api(devB, "GET", "/v1/channels/d.full/messages?subscriber=check&from=earliest&max=10000&wait=200")).json()) as { messages?: { seq: number; payload: { i: number } }[] };
      if (r.messages?.length) {
        atB.push(...r.messages.map((m) => m.payload.i));
        await api(devB, "POST", "/v1/channels/d.full/subscribers/check/ack", JSON.stringify({ seq: r.messages.at(-1)!.seq }));
      }
    };
    await publishOnA(10, 0);
    await waitFor(async () => (await readB(), atB.length >= 10), "the first ten at B", 20_000);

    // The hub's disk fills up.
    const filler = join(mnt, "filler");
    const free = Number(Bun.spawnSync(["df", "--output=avail", "-B1", mnt]).stdout.toString().trim().split("\n")[1]);
    writeFileSync(filler, new Uint8Array(Math.max(0, free - 4096)));
    // More than the 1 MiB the hub's active segment has preallocated ahead of its records.
    for (let k = 0; k < 6; k++) await publishOnA(500, 10 + k * 500);
    const hubPublish = await api(hub, "POST", "/v1/channels/d.local/messages", JSON.stringify({ type: "t", payload: "x".repeat(20_000) }));
    expect(hubPublish.status).toBe(507);
    expect(((await hubPublish.json()) as { error: { code: string } }).error.code).toBe("disk_full");
    // Reads at the hub still work, and A keeps what the hub could not take.
    const hubRead = await api(hub, "GET", "/v1/channels/d.full/messages?subscriber=r&from=earliest&max=5");
    expect(hubRead.status).toBe(200);
    await waitFor(
      async () => {
        const st = (await (await api(devA, "GET", "/v1/status")).json()) as any;
        return (st.links[0]?.backlog?.find((b: any) => b.channel === "d.full")?.messages ?? 0) > 0;
      },
      "a backlog kept at A",
      20_000,
    );
    expect(hub.child.proc.exitCode).toBe(null);

    // Space is back: everything arrives, once, in order.
    unlinkSync(filler);
    await waitFor(async () => (await readB(), atB.length >= 3010), "all 3,010 at B", 60_000);
    expect(atB).toEqual(Array.from({ length: 3010 }, (_, i) => i));
    expect(hub.logs()).toContain("disk_full");
  }, 120_000);
});
