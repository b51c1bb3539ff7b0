/**
 * A disk that returns I/O errors for a while and then works again, as SD
 * cards, eMMC and USB disks on boards do: ext4 (no journal, errors=continue)
 * on a loop device whose backing file lives on a small tmpfs. While the
 * tmpfs is full, write-back of new blocks fails (fdatasync reports EIO and
 * the kernel drops the dirty pages); once the tmpfs is grown, writes work
 * again. Publishers keep publishing throughout; then the agent is killed,
 * the file system unmounted and mounted again (so nothing is read back from
 * the page cache), and every acknowledged message must be there, once, in
 * order. Skipped, loudly, where loop devices cannot be made or mounted
 * (not root, no loop driver).
 */
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { waitFor } from "../helpers.ts";
import { runAgent, type AgentProc } from "../integration/agent-process.ts";
import { makeFlakyDisk, type FlakyDisk } from "./flaky-disk.ts";

const root = mkdtempSync(join(tmpdir(), "keyop-flaky-"));
let disk: FlakyDisk | null = null;
let skipReason: string | null = process.platform !== "linux" ? "not Linux" : process.getuid?.() !== 0 ? "needs root (mount, losetup)" : null;
if (!skipReason) {
  const made = makeFlakyDisk(root, 20);
  if (typeof made === "string") skipReason = `cannot make a loop-device file system (${made})`;
  else disk = made;
}
if (skipReason) console.log(`SKIP flaky-disk test: ${skipReason}`);
let agent: AgentProc | null = null;
// How long the disk stays bad under load; the fault suite's long run doubles it.
const failingMs = process.env.KEYOP_FAULT_LONG ? 8_000 : 4_000;

afterAll(async () => {
  if (agent && agent.child.proc.exitCode === null) {
    agent.child.proc.kill("SIGKILL");
    await agent.child.proc.exited;
  }
  if (process.env.KEEP_TMP) return console.log(`flaky disk kept at ${root}`);
  disk?.destroy();
  rmSync(root, { recursive: true, force: true });
});

const post = (a: AgentProc, body: string) => fetch("http://k/v1/channels/flaky/messages", { method: "POST", body, headers: { "content-type": "application/json" }, unix: a.socket } as RequestInit);

describe.skipIf(skipReason !== null)("a disk that fails and comes back", () => {
  test("every acknowledged message survives the failure and a remount, once and in order; every refusal was typed", async () => {
    const d = disk!;
    agent = await runAgent(d.mountPoint);
    const a = agent;
    const acked: { seq: number; i: number }[] = [];
    const refusals = new Map<string, number>();
    let next = 0;
    let stop = false;
    const pad = "p".repeat(2000);
    const publisher = async () => {
      while (!stop) {
        const i = next++;
        let r: Response;
        try {
          r = await post(a, JSON.stringify({ type: "t", payload: { i, pad } }));
        } catch (err) {
          throw new Error(`the agent stopped answering: ${String(err)}\n${a.logs().slice(-2000)}`);
        }
        const body = (await r.json()) as { seq?: number; error?: { code: string } };
        if (r.status === 201) acked.push({ seq: body.seq!, i });
        else {
          const key = `${r.status} ${body.error?.code ?? "(no code)"}`;
          refusals.set(key, (refusals.get(key) ?? 0) + 1);
          await Bun.sleep(10); // as a client would back off
        }
      }
    };
    const running = Array.from({ length: 16 }, publisher);
    // Fill the tmpfs behind the loop device: from here on, write-back of new blocks fails.
    await waitFor(() => acked.length >= 200, "some messages acknowledged on a healthy disk", 20_000);
    d.fillBacking();
    const failedAt = Date.now();
    await waitFor(() => [...refusals.values()].reduce((x, y) => x + y, 0) >= 50, "refusals while the disk fails", 30_000);
    // The disk stays bad for a few seconds of load (the scenario, not a wait for a condition).
    await Bun.sleep(Math.max(0, failingMs - (Date.now() - failedAt)));
    const ackedWhileFailing = acked.length;
    // The disk comes back.
    d.growBacking(600);
    await waitFor(() => acked.length >= ackedWhileFailing + 2000, "acknowledgements once the disk works again", 60_000);
    stop = true;
    await Promise.all(running);
    console.log(`flaky disk: ${acked.length} acknowledged, refusals ${JSON.stringify(Object.fromEntries(refusals))}`);
    for (const key of refusals.keys()) expect(key).toMatch(/^5\d\d (io_error|disk_full|log_unavailable)$/);
    // The agent saw the failures, went back to its durable end, refused while it could not, and recovered.
    const events = (msg: string) =>
      a
        .logs()
        .split("\n")
        .filter((l) => l.includes(`"msg":"${msg}"`)).length;
    console.log(`flaky disk: ${events("fdatasync failed")} failed fdatasyncs, ${events("log resealed after a failed fdatasync")} reseals, ${events("channel log writable again")} recoveries`);
    expect(events("fdatasync failed")).toBeGreaterThan(0);
    expect(events("log resealed after a failed fdatasync")).toBeGreaterThan(0);
    const status = (await (await fetch("http://k/v1/status", { unix: a.socket } as RequestInit)).json()) as any;
    console.log(JSON.stringify(status.channels?.find?.((c: any) => c.channel === "flaky") ?? status).slice(0, 600));

    // A hard stop, then the file system is unmounted and mounted again: what is read now comes from the disk.
    a.child.proc.kill("SIGKILL");
    await a.child.proc.exited;
    d.remount();
    agent = await runAgent(d.mountPoint);
    const b = agent;
    const got: { seq: number; i: number }[] = [];
    for (;;) {
      const r = (await (await fetch("http://k/v1/channels/flaky/messages?subscriber=check&from=earliest&max=5000", { unix: b.socket } as RequestInit)).json()) as {
        messages: { seq: number; payload: { i: number } }[];
      };
      if (r.messages.length === 0) break;
      for (const m of r.messages) got.push({ seq: m.seq, i: m.payload.i });
      const ack = await fetch("http://k/v1/channels/flaky/subscribers/check/ack", {
        method: "POST",
        body: JSON.stringify({ seq: r.messages.at(-1)!.seq }),
        headers: { "content-type": "application/json" },
        unix: b.socket,
      } as RequestInit);
      expect(ack.status).toBeLessThan(300);
    }
    const bySeq = new Map(got.map((m) => [m.seq, m.i]));
    const missing = acked.filter((m) => bySeq.get(m.seq) !== m.i);
    console.log(`after the remount: ${got.length} readable, ${missing.length} of the acknowledged missing`, missing.slice(0, 5));
    if (missing.length > 0) console.log(a.logs(), "\n---- after the remount\n", b.logs());
    expect(missing.length).toBe(0);
    // Each once, in order.
    const seqs = got.map((m) => m.seq);
    expect(seqs).toEqual([...seqs].sort((x, y) => x - y));
    expect(new Set(got.map((m) => m.i)).size).toBe(got.length);
  }, 180_000);
});
