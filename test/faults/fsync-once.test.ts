/**
 * One failed fdatasync, on demand, of one chosen file, while everything else
 * works: faultfs (faultfs.c, FUSE) fails the next fsync of the channel's
 * segment and overwrites with junk every byte written to it since its last
 * good fsync, as the kernel drops pages it could not write back. The agent
 * must write the pending records again into a fresh segment and acknowledge
 * them only after that segment's own fdatasync: any record acknowledged on
 * the strength of the failed one would read back as junk. Then a hard kill
 * and a restart: every acknowledged message is there, once, in order.
 * Under `sync: interval` the failed fdatasync is the periodic one: the
 * records committed since the last good one are read back and carried into
 * the fresh segment; any that cannot be must be counted as lost, never
 * silently dropped. Skipped, loudly, where FUSE, libfuse3 or a C compiler
 * is missing.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { tmpDir, waitFor } from "../helpers.ts";
import { runAgent, type AgentProc } from "../integration/agent-process.ts";

const dir = tmpDir("keyop-faultfs-");
const mnt = join(dir, "mnt");
const control = join(dir, "control");
const events = join(dir, "events");

function prepare(): string | null {
  if (process.platform !== "linux") return "not Linux";
  if (!existsSync("/dev/fuse")) return "no /dev/fuse";
  const flags = Bun.spawnSync(["pkg-config", "--cflags", "--libs", "fuse3"], { stdout: "pipe", stderr: "pipe" });
  if (flags.exitCode !== 0) return "libfuse3 not found (apt-get install libfuse3-dev fuse3)";
  const bin = join(dir, "faultfs");
  const cc = Bun.spawnSync(["cc", "-O1", "-o", bin, join(import.meta.dir, "faultfs.c"), ...flags.stdout.toString().trim().split(/\s+/)], { stdout: "pipe", stderr: "pipe" });
  if (cc.exitCode !== 0) return `cc failed: ${cc.stderr.toString().trim()}`;
  return null;
}

const skipReason = prepare();
if (skipReason) console.log(`SKIP fsync-once test: ${skipReason}`);
let fs: ReturnType<typeof Bun.spawn> | null = null;
let generation = 0;

/** Every agent a test started: all are stopped at the end, not only the last. */
const agents: AgentProc[] = [];

afterAll(async () => {
  for (const a of agents) {
    if (a.child.proc.exitCode !== null || a.child.proc.signalCode !== null) continue;
    a.child.proc.kill("SIGKILL");
    await a.child.proc.exited;
  }
  if (fs) {
    Bun.spawnSync(["fusermount3", "-u", mnt]);
    fs.kill("SIGTERM");
    await fs.exited;
  }
});

const post = (a: AgentProc, i: number) =>
  fetch("http://k/v1/channels/f/messages", {
    method: "POST",
    body: JSON.stringify({ type: "t", payload: { i, pad: "e".repeat(300) } }),
    headers: { "content-type": "application/json" },
    unix: a.socket,
  } as RequestInit);

function start(into: string, sync: "always" | "interval", data: string): Promise<AgentProc> {
  mkdirSync(into, { recursive: true });
  const cfg = join(into, "keyop.yaml");
  writeFileSync(cfg, `storage:\n  sync: ${sync}\n  sync_interval_ms: 50ms\n`);
  return runAgent(into, ["--config", cfg, "--data-dir", join(mnt, data)]).then((a) => {
    agents.push(a);
    return a;
  });
}

async function mountFaultfs(): Promise<void> {
  if (fs) return;
  const backing = join(dir, "backing");
  mkdirSync(backing);
  mkdirSync(mnt);
  writeFileSync(control, "0 -\n");
  fs = Bun.spawn([join(dir, "faultfs"), backing, control, events, mnt], { stdout: "pipe", stderr: "pipe" });
  await waitFor(() => Bun.spawnSync(["mountpoint", "-q", mnt]).exitCode === 0, "faultfs mounted", 10_000);
}

describe.skipIf(skipReason !== null)("fdatasyncs that fail", () => {
  test.each(["always", "interval"] as const)(
    "sync: %s: the pending records are written again (acknowledged after their own fdatasync under always); nothing acknowledged is lost across a restart",
    async (sync) => {
      await mountFaultfs();
      const data = `data-${sync}`;
      const a = await start(join(dir, `${sync}-1`), sync, data);
      const acked: { seq: number; i: number }[] = [];
      const refused: string[] = [];
      let next = 0;
      let stop = false;
      const publisher = async () => {
        while (!stop) {
          const i = next++;
          const r = await post(a, i);
          const body = (await r.json()) as { seq?: number; error?: { code: string } };
          if (r.status === 201) acked.push({ seq: body.seq!, i });
          else refused.push(`${r.status} ${body.error?.code}`);
        }
      };
      const running = Array.from({ length: 8 }, publisher);
      await waitFor(() => acked.length >= 300, "acknowledgements before the fault", 30_000);
      // The next fsync of the channel's segment fails, and what it should have written is junk.
      // faultfs fails one fsync per new generation.
      writeFileSync(control, `${++generation} /${data}/channels/f/\n`);
      await waitFor(
        () =>
          existsSync(events) &&
          readFileSync(events, "utf8")
            .split("\n")
            .filter((l) => l.includes(`failed /${data}/channels/f/`)).length > 0,
        "the failed fsync",
        30_000,
      );
      const atFault = acked.length;
      await waitFor(() => acked.length >= atFault + 300, "acknowledgements after the fault", 30_000);
      stop = true;
      await Promise.all(running);

      const log = a.logs();
      expect(log).toContain('"msg":"fdatasync failed"');
      expect(log).toContain('"msg":"log resealed after a failed fdatasync"');
      // The fresh segment took a write and an fdatasync at once, so no publisher saw an error.
      expect(refused).toEqual([]);
      const st = (await (await fetch("http://k/v1/status", { unix: a.socket } as RequestInit)).json()) as {
        storage: { disk: { state: string; failed_syncs: number; reseals: number; lost_records: number } };
      };
      expect(st.storage.disk).toMatchObject({ state: "ok", failed_syncs: 1, reseals: 1 });

      a.child.proc.kill("SIGKILL");
      await a.child.proc.exited;
      const b = await start(join(dir, `${sync}-2`), sync, data);
      const got: { seq: number; i: number }[] = [];
      for (;;) {
        const r = (await (await fetch("http://k/v1/channels/f/messages?subscriber=check&from=earliest&max=1000", { unix: b.socket } as RequestInit)).json()) as {
          messages: { seq: number; payload: { i: number } }[];
        };
        if (r.messages.length === 0) break;
        for (const m of r.messages) got.push({ seq: m.seq, i: m.payload.i });
        await fetch("http://k/v1/channels/f/subscribers/check/ack", {
          method: "POST",
          body: JSON.stringify({ seq: r.messages.at(-1)!.seq }),
          headers: { "content-type": "application/json" },
          unix: b.socket,
        } as RequestInit);
      }
      const bySeq = new Map(got.map((m) => [m.seq, m.i]));
      const missing = acked.filter((m) => bySeq.get(m.seq) !== m.i);
      // Under interval the records committed since the last good fdatasync are carried over from
      // memory: reading them back would return the junk the disk now holds.
      console.log(`sync ${sync}: ${acked.length} acknowledged, ${missing.length} missing after the restart, ${st.storage.disk.lost_records} counted lost`);
      if (missing.length > 0) console.log(log, "\n---- after the restart\n", b.logs(), "\n---- faultfs events\n", readFileSync(events, "utf8").slice(-3000));
      expect(st.storage.disk.lost_records).toBe(0);
      expect(missing).toEqual([]);
      const seqs = got.map((m) => m.seq);
      expect(seqs).toEqual(Array.from({ length: seqs.length }, (_, k) => seqs[0]! + k));
      expect(new Set(got.map((m) => m.i)).size).toBe(got.length);
      expect(b.logs()).not.toContain("corruption in the middle");
    },
    120_000,
  );

  test("a channel whose disk keeps failing refuses with log_unavailable while other channels, reads and status go on; it takes appends again once the disk works", async () => {
    await mountFaultfs();
    const data = "data-refuse";
    const a = await start(join(dir, "refuse-1"), "always", data);
    const pub = async (ch: string, i: number) => {
      const r = await fetch(`http://k/v1/channels/${ch}/messages`, {
        method: "POST",
        body: JSON.stringify({ type: "t", payload: { i } }),
        headers: { "content-type": "application/json" },
        unix: a.socket,
      } as RequestInit);
      const body = (await r.json()) as { seq?: number; error?: { code: string } };
      return { status: r.status, seq: body.seq, code: body.error?.code };
    };
    const acked: Record<string, { seq: number; i: number }[]> = { f: [], g: [] };
    let i = 0;
    const publishOk = async (ch: string) => {
      const mine = ++i;
      const r = await pub(ch, mine);
      expect(r.status).toBe(201);
      acked[ch]!.push({ seq: r.seq!, i: mine });
    };
    for (let k = 0; k < 20; k++) await Promise.all([publishOk("f"), publishOk("g")]);
    // Every fsync of channel f's files fails from now on.
    writeFileSync(control, `${++generation} /${data}/channels/f/ 1000000\n`);
    let refusal: { status: number; code?: string } | null = null;
    await waitFor(
      async () => {
        const mine = ++i;
        const r = await pub("f", mine);
        if (r.status === 201) acked.f!.push({ seq: r.seq!, i: mine });
        else refusal = r;
        return r.status === 503;
      },
      "channel f refusing",
      30_000,
    );
    expect(refusal).toEqual({ status: 503, code: "log_unavailable", seq: undefined } as never);
    // The other channel takes appends, reads of both go on, status and metrics say which channel refuses.
    for (let k = 0; k < 20; k++) await publishOk("g");
    let readers = 0;
    const readAll = async (socket: string, ch: string) => {
      const r = (await (await fetch(`http://k/v1/channels/${ch}/messages?subscriber=reader-${++readers}&from=earliest&max=1000`, { unix: socket } as RequestInit)).json()) as {
        messages: { seq: number; payload: { i: number } }[];
      };
      return r.messages.map((m) => ({ seq: m.seq, i: m.payload.i }));
    };
    expect(await readAll(a.socket, "f")).toEqual(acked.f!);
    expect(await readAll(a.socket, "g")).toEqual(acked.g!);
    const st = (await (await fetch("http://k/v1/status", { unix: a.socket } as RequestInit)).json()) as { storage: { disk: { state: string; refusing_channels: string[] } } };
    expect(st.storage.disk.state).toBe("failing");
    expect(st.storage.disk.refusing_channels).toEqual(["f"]);
    const metrics = await (await fetch("http://k/metrics", { unix: a.socket } as RequestInit)).text();
    expect(metrics).toContain('keyop_log_writable{channel="f"} 0');
    expect(metrics).toContain('keyop_log_writable{channel="g"} 1');
    expect(a.logs()).toContain('"msg":"channel log refuses appends"');

    // The disk works again: the channel's own retries make it writable, with no restart.
    writeFileSync(control, `${++generation} - 0\n`);
    await waitFor(
      async () => {
        const mine = ++i;
        const r = await pub("f", mine);
        if (r.status === 201) acked.f!.push({ seq: r.seq!, i: mine });
        return r.status === 201;
      },
      "channel f writable again",
      30_000,
    );
    expect(a.logs()).toContain('"msg":"channel log writable again"');
    await publishOk("f");

    a.child.proc.kill("SIGKILL");
    await a.child.proc.exited;
    const b = await start(join(dir, "refuse-2"), "always", data);
    expect(await readAll(b.socket, "f")).toEqual(acked.f!);
    expect(await readAll(b.socket, "g")).toEqual(acked.g!);
  }, 120_000);
});
