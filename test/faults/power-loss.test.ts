/**
 * Fault scenario 2: what a power cut can leave on disk. The data of a
 * killed agent is copied, then its active segment is cut, overwritten with
 * garbage, or given a zero-filled tail at random positions, or a cursor
 * file is damaged; `keyop run` on each copy must start, keep every record
 * the damage did not touch (a cut or torn tail: those before it; garbage
 * with whole records after it: those too, the lost ones reported), say what
 * it cut or lost, and take new messages.
 * KEYOP_FAULT_LONG=1 runs 10 times more damaged copies.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { cpSync, existsSync, readdirSync, readFileSync, statSync, truncateSync, writeFileSync, openSync, writeSync, closeSync } from "node:fs";
import { join } from "node:path";
import { tmpDir, waitFor } from "../helpers.ts";
import { runAgent, type AgentProc } from "../integration/agent-process.ts";

const ROUNDS = process.env.KEYOP_FAULT_LONG ? 40 : 4;
const N = 300;
let base: string;

beforeAll(async () => {
  base = tmpDir();
  const a = await runAgent(base);
  const body = Array.from({ length: N }, (_, i) => JSON.stringify({ type: "n", payload: { i, pad: "p".repeat(i % 50) } })).join("\n");
  const r = await fetch("http://k/v1/channels/p.a/messages", { method: "POST", body, headers: { "content-type": "application/x-ndjson" }, unix: a.socket } as RequestInit);
  expect(r.status).toBe(201);
  // A subscriber that acked up to 100.
  await fetch("http://k/v1/channels/p.a/messages?subscriber=s&from=earliest&max=1", { unix: a.socket } as RequestInit);
  await fetch("http://k/v1/channels/p.a/subscribers/s/ack", { method: "POST", body: '{"seq":100}', headers: { "content-type": "application/json" }, unix: a.socket } as RequestInit);
  // The cursor reaches its file on the next flush (every 100 ms); then cut the power.
  const subs = join(base, "data", "subscribers");
  await waitFor(() => readdirSync(subs).some((f) => f.endsWith("~s.json") && JSON.parse(readFileSync(join(subs, f), "utf8")).cursors["p.a"] === 101), "cursor on disk");
  a.child.proc.kill("SIGKILL");
  await a.child.proc.exited;
}, 60_000);

const started: AgentProc[] = [];
afterAll(async () => {
  for (const a of started) {
    a.child.proc.kill("SIGKILL");
    await a.child.proc.exited;
  }
});

/** The active segment of p.a in a copy, and the end offset of every record in it. */
function segmentOf(dir: string): { path: string; ends: number[]; valid: number } {
  const chDir = join(dir, "data", "channels", "p.a");
  const file = readdirSync(chDir)
    .filter((f) => f.endsWith(".log"))
    .sort()
    .at(-1)!;
  const path = join(chDir, file);
  const buf = readFileSync(path);
  const ends: number[] = [];
  let off = 0;
  while (off + 16 <= buf.length) {
    const len = buf.readUInt32LE(off);
    if (len === 0) break; // preallocated zeros
    off += 16 + len;
    ends.push(off);
  }
  return { path, ends, valid: off };
}

/** Payload indexes readable on p.a, in order. */
async function readAll(a: AgentProc): Promise<number[]> {
  const out: number[] = [];
  while (true) {
    const r = (await (await fetch(`http://k/v1/channels/p.a/messages?subscriber=verify&from=earliest&max=1000`, { unix: a.socket } as RequestInit)).json()) as {
      messages?: { seq: number; payload: { i: number } }[];
    };
    if (!r.messages?.length) return out;
    out.push(...r.messages.map((m) => m.payload.i));
    await fetch(`http://k/v1/channels/p.a/subscribers/verify/ack`, {
      method: "POST",
      body: JSON.stringify({ seq: r.messages.at(-1)!.seq }),
      headers: { "content-type": "application/json" },
      unix: a.socket,
    } as RequestInit);
  }
}

let seed = 4242;
const rnd = (n: number) => Math.floor(((seed = (seed * 1_103_515_245 + 12_345) & 0x7fffffff) / 0x7fffffff) * n);

describe("power loss: damaged files at random positions", () => {
  for (const mode of ["cut", "garbage", "zero-filled tail"] as const) {
    test(`${mode}: start keeps every record the damage did not touch, says so, takes new messages (${ROUNDS} positions)`, async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const dir = tmpDir();
        cpSync(join(base, "data"), join(dir, "data"), { recursive: true }); // (not the socket file the kill left)
        const seg = segmentOf(dir);
        const at = rnd(seg.valid);
        let expected: number[];
        let nextSeq: number;
        let middle = false;
        if (mode === "garbage") {
          const before = readFileSync(seg.path);
          const fd = openSync(seg.path, "r+");
          const junk = Uint8Array.from({ length: 1 + rnd(8) }, () => rnd(256));
          writeSync(fd, junk, 0, junk.length, at);
          closeSync(fd);
          const after = readFileSync(seg.path);
          // The records with a changed byte are damaged; with an undamaged record after them it
          // is damage in the middle (the rest kept), else a torn tail (cut at the first damaged).
          const damaged = seg.ends.map((end, k) => {
            const start = k === 0 ? 0 : seg.ends[k - 1]!;
            return !before.subarray(start, end).equals(after.subarray(start, end));
          });
          const lastDamaged = damaged.lastIndexOf(true);
          middle = lastDamaged >= 0 && lastDamaged < N - 1;
          if (middle) {
            expected = Array.from({ length: N }, (_, k) => k).filter((k) => !damaged[k]);
            nextSeq = N + 1;
          } else {
            const firstDamaged = damaged.indexOf(true);
            const keep = firstDamaged < 0 ? N : firstDamaged;
            expected = Array.from({ length: keep }, (_, k) => k);
            nextSeq = keep + 1;
          }
        } else {
          truncateSync(seg.path, at);
          if (mode === "zero-filled tail") writeFileSync(seg.path, new Uint8Array(64 * 1024), { flag: "a" });
          const keep = seg.ends.filter((e) => e <= at).length;
          expected = Array.from({ length: keep }, (_, k) => k);
          nextSeq = keep + 1;
        }
        const a = await runAgent(dir);
        started.push(a);
        const got = await readAll(a);
        // Nothing the damage did not touch lost, nothing invented, in order.
        expect({ round, at, got }).toEqual({ round, at, got: expected });
        const r = await fetch("http://k/v1/channels/p.a/messages", {
          method: "POST",
          body: JSON.stringify({ type: "n", payload: { i: N + 1000 } }),
          headers: { "content-type": "application/json" },
          unix: a.socket,
        } as RequestInit);
        expect(((await r.json()) as { seq: number }).seq).toBe(nextSeq);
        expect(await readAll(a)).toEqual([N + 1000]); // right after what was kept
        // It said what it cut or lost, when there was something to cut or lose.
        const lines = a.logs().split("\n");
        const said = lines.some((l) => l.includes(middle ? "corruption in the middle" : "recovered torn tail"));
        const tornInside = mode === "garbage" ? expected.length < N : !seg.ends.includes(at);
        if (tornInside && at > 0) expect({ round, at, said }).toEqual({ round, at, said: true });
        a.child.proc.kill("SIGTERM");
        await a.child.proc.exited;
      }
    }, 120_000);
  }

  test("a damaged cursor file is set aside and the subscriber starts over; the log is untouched", async () => {
    const dir = tmpDir();
    cpSync(join(base, "data"), join(dir, "data"), { recursive: true }); // (not the socket file the kill left)
    const subs = join(dir, "data", "subscribers");
    const file = readdirSync(subs).find((f) => f.endsWith("~s.json"))!;
    const full = readFileSync(join(subs, file));
    expect(JSON.parse(full.toString()).cursors["p.a"]).toBe(101);
    writeFileSync(join(subs, file), full.subarray(0, rnd(full.length - 1)));
    const a = await runAgent(dir);
    started.push(a);
    expect(a.logs()).toContain("unreadable cursor file set aside");
    expect(existsSync(join(subs, file + ".corrupt"))).toBe(true);
    expect(statSync(join(subs, file + ".corrupt")).size).toBeLessThan(full.length);
    expect((await readAll(a)).length).toBe(N);
    a.child.proc.kill("SIGTERM");
    await a.child.proc.exited;
  }, 60_000);
});
