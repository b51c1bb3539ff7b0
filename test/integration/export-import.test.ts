/**
 * `keyop export` and `keyop import` against real agents: reading the log
 * files while the agent runs and after it stopped, bounds by seq and time,
 * both formats, ids kept and duplicates dropped, damage skipped, bad input.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { closeSync, openSync, readdirSync, readFileSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { BUN, MAIN, tmpDir } from "../helpers.ts";
import { runAgent, type AgentProc } from "./agent-process.ts";

let dir: string;
let a: AgentProc;
let b: AgentProc;

async function api(p: AgentProc, method: string, path: string, body?: string, type = "application/json"): Promise<any> {
  const r = await fetch(`http://k${path}`, { method, body, headers: body ? { "content-type": type } : {}, unix: p.socket } as RequestInit);
  return r.json();
}

/** Runs the CLI with stdin from `input`; stdout as bytes. */
async function keyop(args: string[], input?: Uint8Array | string): Promise<{ code: number; out: Uint8Array; err: string }> {
  const proc = Bun.spawn([BUN, MAIN, ...args], { stdin: input === undefined ? "ignore" : new Blob([input]), stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(proc.stdout).arrayBuffer(), new Response(proc.stderr).text(), proc.exited]);
  return { code, out: new Uint8Array(out), err };
}
const lines = (b: Uint8Array) =>
  new TextDecoder()
    .decode(b)
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => JSON.parse(l));

beforeAll(async () => {
  dir = tmpDir();
  a = await runAgent(join(dir, "a"));
  const bCfg = join(dir, "b.yaml");
  writeFileSync(bCfg, "name: agent-b\n");
  b = await runAgent(join(dir, "b"), ["--config", bCfg]);
  const batch = (n: number, tag: string) =>
    Array.from({ length: n }, (_, i) => JSON.stringify({ type: "reading", payload: { tag, i, bytes: { $base64: "AAE=" } }, correlation_id: `c-${i}` })).join("\n") + "\n";
  await api(a, "POST", "/v1/channels/ex.a/messages", batch(300, "a"), "application/x-ndjson");
  await api(a, "POST", "/v1/channels/ex.b/messages", batch(5, "b"), "application/x-ndjson");
  // A subscriber part-way through ex.a: an export must not move it.
  await api(a, "GET", "/v1/channels/ex.a/messages?subscriber=s&from=earliest&max=1");
  await api(a, "POST", "/v1/channels/ex.a/subscribers/s/ack", JSON.stringify({ seq: 10 }));
}, 60_000);

afterAll(async () => {
  for (const p of [a, b]) {
    p.child.proc.kill("SIGTERM");
    await p.child.proc.exited;
  }
});

describe("keyop export / import", () => {
  test("export of a pattern while the agent runs: every message in channel and seq order, no cursor moved, nothing created", async () => {
    const before = await api(a, "GET", "/v1/channels");
    const r = await keyop(["export", "ex.>", "--data-dir", a.dataDir]);
    expect(r.err).toBe("");
    expect(r.code).toBe(0);
    const got = lines(r.out);
    expect(got.length).toBe(305);
    expect(got.slice(0, 300).map((m) => m.seq)).toEqual(Array.from({ length: 300 }, (_, i) => i + 1));
    expect(got.slice(300).map((m) => m.channel)).toEqual(Array(5).fill("ex.b"));
    expect(got[0]).toMatchObject({ channel: "ex.a", type: "reading", correlation_id: "c-0", payload: { tag: "a", i: 0, bytes: { $base64: "AAE=" } } });
    expect(await api(a, "GET", "/v1/channels")).toEqual(before);
  });

  test("--from and --to by seq and by time, both ends included", async () => {
    const bySeq = lines((await keyop(["export", "ex.a", "--from", "10", "--to", "20", "--data-dir", a.dataDir])).out);
    expect(bySeq.map((m) => m.seq)).toEqual(Array.from({ length: 11 }, (_, i) => i + 10));
    const all = lines((await keyop(["export", "ex.a", "--data-dir", a.dataDir])).out);
    const t = new Date(all[150].ts).toISOString();
    const byTime = lines((await keyop(["export", "ex.a", "--from", t, "--data-dir", a.dataDir])).out);
    expect(byTime.length).toBe(all.filter((m) => m.ts >= all[150].ts).length);
    expect(byTime.every((m) => m.ts >= all[150].ts)).toBe(true);
    const bad = await keyop(["export", "ex.a", "--from", "yesterday-ish", "--data-dir", a.dataDir]);
    expect(bad.code).toBe(2);
    expect(bad.err).toContain("--from");
    const none = await keyop(["export", "nothing.here", "--data-dir", a.dataDir]);
    expect(none.code).toBe(1);
  });

  test("msgpack export into another agent: ids, times, origins kept, this agent added to the route; again: every one a duplicate", async () => {
    const exp = await keyop(["export", "ex.>", "--format", "msgpack", "--data-dir", a.dataDir]);
    expect(exp.code).toBe(0);
    const imp = await keyop(["import", "--socket", b.socket], exp.out);
    expect(imp.code).toBe(0);
    expect(imp.err).toContain("305 imported, 0 duplicates");
    const original = lines((await keyop(["export", "ex.a", "--data-dir", a.dataDir])).out);
    const copied = (await api(b, "GET", "/v1/channels/ex.a/messages?subscriber=check&from=earliest&max=1000")).messages;
    expect(copied.length).toBe(300);
    expect(copied.map((m: any) => m.id)).toEqual(original.map((m) => m.id));
    expect(copied[0]).toMatchObject({ ts: original[0].ts, origin: original[0].origin, correlation_id: "c-0", payload: { tag: "a", i: 0, bytes: { $base64: "AAE=" } } });
    expect(copied[0].route).toEqual([...original[0].route, "agent-b"]);
    const again = await keyop(["import", "--socket", b.socket], exp.out);
    expect(again.err).toContain("0 imported, 305 duplicates");
    // NDJSON of the same into the agent it came from: all there already.
    const nd = await keyop(["export", "ex.>", "--data-dir", a.dataDir]);
    const same = await keyop(["import", "--socket", a.socket], nd.out);
    expect(same.err).toContain("0 imported, 305 duplicates");
  });

  test("a bad line stops the import there, naming it; what came before is stored", async () => {
    const good = lines((await keyop(["export", "ex.b", "--data-dir", a.dataDir])).out).map((m) => ({ ...m, channel: "ex.c" }));
    const text = [JSON.stringify(good[0]), JSON.stringify(good[1]), '{"id": "not-a-uuid"}', JSON.stringify(good[2])].join("\n") + "\n";
    const r = await keyop(["import", "--socket", b.socket], text);
    expect(r.code).toBe(1);
    expect(r.err).toContain("line 3");
    expect(r.err).toContain("2 imported before it");
    const stored = (await api(b, "GET", "/v1/channels/ex.c/messages?subscriber=check&from=earliest")).messages;
    expect(stored.map((m: any) => m.id)).toEqual([good[0].id, good[1].id]);
    expect((await keyop(["import", "--socket", b.socket], "")).code).toBe(1);
  });

  test("with the agent stopped: the same export; a damaged record is skipped and reported", async () => {
    const running = await keyop(["export", "ex.a", "--data-dir", a.dataDir]);
    a.child.proc.kill("SIGTERM");
    await a.child.proc.exited;
    const stopped = await keyop(["export", "ex.a", "--data-dir", a.dataDir]);
    expect(stopped.code).toBe(0);
    expect(new TextDecoder().decode(stopped.out)).toBe(new TextDecoder().decode(running.out));
    // Flip a byte inside record 100's body.
    const segDir = join(a.dataDir, "channels", "ex.a");
    const seg = join(segDir, readdirSync(segDir).find((n) => n.endsWith(".log"))!);
    const bytes = readFileSync(seg);
    let off = 0;
    for (let s = 1; s < 100; s++) off += 16 + bytes.readUInt32LE(off);
    const fd = openSync(seg, "r+");
    writeSync(fd, Buffer.from([bytes[off + 20]! ^ 0xff]), 0, 1, off + 20);
    closeSync(fd);
    const damaged = await keyop(["export", "ex.a", "--data-dir", a.dataDir]);
    expect(damaged.code).toBe(0);
    expect(damaged.err).toContain("skipped 1 damaged");
    const seqs = lines(damaged.out).map((m) => m.seq);
    expect(seqs.length).toBe(299);
    expect(seqs.includes(100)).toBe(false);
    expect(seqs.includes(101)).toBe(true);
    a = await runAgent(join(dir, "a"));
  });
});
