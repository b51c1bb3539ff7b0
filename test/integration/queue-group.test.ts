/**
 * Competing consumers across real processes: three workers of different
 * kinds (`keyop sub --queue`, `keyop sub --queue --exec`, the Python
 * example) on one subscriber of a real agent, one SIGKILLed mid-stream.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { BUN, MAIN, spawnLines, tmpDir, waitFor, type LineChild } from "../helpers.ts";
import { runAgent, type AgentProc } from "./agent-process.ts";

const EXAMPLES = join(import.meta.dir, "..", "..", "examples");
let agent: AgentProc;
beforeAll(async () => {
  agent = await runAgent(tmpDir());
});
afterAll(async () => {
  agent.child.proc.kill("SIGTERM");
  await agent.child.proc.exited;
});

const env = () => ({ KEYOP_SOCKET: agent.socket });
const api = async (method: string, path: string, body?: string, type = "application/json") =>
  (await fetch(`http://k${path}`, { method, body, unix: agent.socket, headers: body ? { "content-type": type } : {} } as RequestInit)).json() as Promise<any>;
const subscriberOf = async (ch: string, name: string) => ((await api("GET", "/v1/channels")).channels.find((c: any) => c.channel === ch)?.subscribers ?? []).find((s: any) => s.name === name);

/** Seqs a worker printed: envelope lines (keyop sub) or "<seq> <id>" (worker.py). */
function seqsOf(w: LineChild): number[] {
  const out: number[] = [];
  for (const line of w.lines) {
    const t = line.trim();
    if (t === "") continue;
    out.push(t.startsWith("{") ? JSON.parse(t).seq : Number(t.split(" ")[0]));
  }
  return out;
}

describe("queue group across processes", () => {
  test("three workers share one subscriber; one SIGKILLed mid-stream loses nothing, and while all live each message goes to one", async () => {
    const N = 1500;
    const body = Array.from({ length: N }, (_, i) => JSON.stringify({ type: "job", payload: { i } })).join("\n") + "\n";
    // Created first, at the start of the channel, so that every worker starts from the same cursor.
    await api("POST", "/v1/channels/jobs/messages", body, "application/x-ndjson");
    const printer = spawnLines([BUN, MAIN, "sub", "jobs", "--name", "workers", "--queue", "--from", "earliest"], env());
    const execer = spawnLines([BUN, MAIN, "sub", "jobs", "--name", "workers", "--queue", "--from", "earliest", "--exec", "cat"], env());
    const python = spawnLines(["python3", join(EXAMPLES, "python/worker.py"), "jobs", "workers", "2"], env());
    const workers = [printer, execer, python];
    try {
      await waitFor(async () => (await subscriberOf("jobs", "workers"))?.queue?.members === 3 || seqsOf(printer).length > 0, "workers joined", 20_000);
      // Kill the printer once it is well into its share, with messages in hand.
      await waitFor(() => seqsOf(printer).length >= 150, "printer busy", 20_000).catch((err) => {
        throw new Error(`${err}: ${workers.map((w) => `${seqsOf(w).length} ${w.stderr()}`).join(" | ")} ${agent.logs().slice(-2000)}`);
      });
      // Freeze it first, so that it surely dies with messages in hand: while it is stopped the
      // group keeps handing it its turns until its window is full, and the others go on.
      printer.proc.kill("SIGSTOP");
      const othersAtStop = seqsOf(execer).length + seqsOf(python).length;
      await waitFor(() => seqsOf(execer).length + seqsOf(python).length >= Math.min(othersAtStop + 100, N - 200), "others went on", 20_000);
      const live = workers.map(seqsOf);
      printer.proc.kill("SIGKILL");
      await printer.done;
      await waitFor(async () => (await subscriberOf("jobs", "workers"))?.cursor === N + 1, "every message acked", 60_000);
      const all = workers.map(seqsOf);
      const handled = new Set(all.flat());
      expect(handled.size).toBe(N);
      for (let s = 1; s <= N; s++) expect(handled.has(s)).toBe(true);
      // Every worker took a share.
      for (const seqs of all) expect(seqs.length).toBeGreaterThan(0);
      // Before the kill no message went to two workers.
      const before = live.flat();
      expect(new Set(before).size).toBe(before.length);
      // After it, a message handled twice is one the printer had printed and not acked: at most its window.
      const twice = [...handled].filter((s) => all.filter((seqs) => seqs.includes(s)).length > 1);
      for (const s of twice) expect(all[0]!.includes(s)).toBe(true);
      expect(twice.length).toBeLessThanOrEqual(16);
      const st = (await subscriberOf("jobs", "workers")).queue;
      expect(st.members).toBe(2);
      expect(st.in_hand).toBe(0);
      // The printer had messages in hand when it died (its window is 16): they went to the others.
      expect(st.redelivered).toBeGreaterThan(0);
    } finally {
      for (const w of workers) w.proc.kill("SIGTERM");
      await Promise.all(workers.map((w) => w.proc.exited));
    }
  }, 120_000);
});
