import { describe, expect, test } from "bun:test";
import { existsSync, readFileSync, watch, writeFileSync } from "node:fs";
import { CODE_LEASE_ENV, OPTIMIZED_AGING_ENV, PURGE_DELAY_MS, SWEEP_INTERVAL_MS } from "../../src/cli/runtime-options.ts";
import { join } from "node:path";
import { BUN, MAIN, spawnLines, tmpDir, waitFor } from "../helpers.ts";
import { cli, runAgent } from "./agent-process.ts";

async function publish(socket: string, payload: unknown): Promise<{ status: number; id?: string }> {
  const r = await fetch("http://k/v1/channels/storm/messages", {
    method: "POST",
    body: JSON.stringify({ type: "t", payload }),
    headers: { "content-type": "application/json" },
    unix: socket,
  } as RequestInit);
  return { status: r.status, id: r.status === 201 ? ((await r.json()) as { id: string }).id : undefined };
}

/** Publishes from `workers` loops until `stop()`; collects the ids answered 201. */
function storm(socket: string, workers: number) {
  const acked = new Set<string>();
  let stopped = false;
  let failures = 0;
  const loops = Array.from({ length: workers }, async (_, w) => {
    for (let i = 0; !stopped; i++) {
      try {
        const r = await publish(socket, { w, i });
        if (r.id) acked.add(r.id);
        else failures++;
      } catch {
        failures++;
        if (stopped) return;
        await Bun.sleep(5);
      }
    }
  });
  return { acked, failures: () => failures, stop: async () => ((stopped = true), await Promise.all(loops)) };
}

async function storedIds(socket: string): Promise<string[]> {
  const ids: string[] = [];
  const name = `check${Date.now()}`;
  while (true) {
    const r = (await (await fetch(`http://k/v1/channels/storm/messages?subscriber=${name}&from=earliest&max=5000`, { unix: socket } as RequestInit)).json()) as {
      messages: { id: string; seq: number }[];
    };
    if (r.messages.length === 0) return ids;
    ids.push(...r.messages.map((m) => m.id));
    await fetch(`http://k/v1/channels/storm/subscribers/${name}/ack`, { method: "POST", body: JSON.stringify({ seq: r.messages.at(-1)!.seq }), unix: socket } as RequestInit);
  }
}

/**
 * Starts `keyop run` and sends it `signals` the moment its socket file appears, that is while
 * Agent.start has not yet returned (inotify is faster than the rest of the start).
 */
function runSignalledAtSocket(signals: NodeJS.Signals[]) {
  const dir = tmpDir();
  const socket = join(dir, "k.sock");
  const child = spawnLines([BUN, MAIN, "run", "--data-dir", join(dir, "data"), "--socket", socket]);
  const w = watch(dir, (_ev, name) => {
    if (name === "k.sock") {
      for (const sig of signals) child.proc.kill(sig);
      w.close();
    }
  });
  return { child, socket, unwatch: () => w.close() };
}

describe("keyop run as a process", () => {
  test("SIGKILL during an HTTP publish storm loses no 201-acknowledged message; the stale socket is replaced", async () => {
    const dir = tmpDir();
    const all = new Set<string>();
    for (let round = 0; round < 3; round++) {
      const agent = await runAgent(dir);
      const s = storm(agent.socket, 32);
      await waitFor(() => s.acked.size >= 300 + round * 100, "acks flowing", 20_000);
      agent.child.proc.kill("SIGKILL");
      await agent.child.proc.exited;
      await s.stop();
      for (const id of s.acked) all.add(id);
      expect(existsSync(agent.socket)).toBe(true); // left behind by the kill
    }
    const agent = await runAgent(dir);
    expect(agent.logs()).toContain("removed stale socket file");
    const stored = new Set(await storedIds(agent.socket));
    const missing = [...all].filter((id) => !stored.has(id));
    expect(missing).toEqual([]);
    expect(all.size).toBeGreaterThan(600);
    agent.child.proc.kill("SIGTERM");
    expect(await agent.child.proc.exited).toBe(0);
  }, 120_000);

  test("SIGTERM under load: exit 0, socket removed, every 201 stored, nothing answered 201 after that", async () => {
    const dir = tmpDir();
    const agent = await runAgent(dir);
    const s = storm(agent.socket, 16);
    await waitFor(() => s.acked.size >= 200, "acks flowing", 20_000);
    agent.child.proc.kill("SIGTERM");
    expect(await agent.child.proc.exited).toBe(0);
    await s.stop();
    expect(existsSync(agent.socket)).toBe(false);
    expect(agent.logs()).toContain('"msg":"agent stopped"');
    const again = await runAgent(dir);
    expect(again.logs()).not.toContain("removed stale socket file");
    expect(again.logs()).not.toContain("torn tail");
    const stored = new Set(await storedIds(again.socket));
    expect([...s.acked].filter((id) => !stored.has(id))).toEqual([]);
    again.child.proc.kill("SIGINT");
    expect(await again.child.proc.exited).toBe(0);
  }, 60_000);

  test("a live agent's socket or data directory is refused to a second agent", async () => {
    const dir = tmpDir();
    const agent = await runAgent(dir);
    const sameSocket = await cli(["run", "--data-dir", join(dir, "other"), "--socket", agent.socket]);
    expect(sameSocket.code).toBe(1);
    expect(sameSocket.err).toContain("another process is serving");
    const sameDir = await cli(["run", "--data-dir", agent.dataDir, "--socket", join(dir, "other.sock")]);
    expect(sameDir.code).toBe(1);
    expect(sameDir.err).toContain("in use by another keyop process");
    expect((await fetch("http://k/healthz", { unix: agent.socket } as RequestInit)).ok).toBe(true);
    agent.child.proc.kill("SIGTERM");
    expect(await agent.child.proc.exited).toBe(0);
  }, 60_000);

  test("config errors: all problems listed with their paths, exit 2, nothing started", async () => {
    const dir = tmpDir();
    const cfg = join(dir, "bad.yaml");
    writeFileSync(cfg, `storage:\n  data_dir: ${dir}/d\n  sync: sometimes\napi:\n  max_message_bytes: lots\nlogg: {}\n`);
    const r = await cli(["run", "--config", cfg]);
    expect(r.code).toBe(2);
    expect(r.err).toContain("invalid configuration (3 problems)");
    expect(r.err).toContain("storage.sync: must be one of always, interval, none");
    expect(r.err).toContain("api.max_message_bytes: must be a size");
    expect(r.err).toContain("logg: unknown key");
    expect(existsSync(join(dir, "d"))).toBe(false);
    const yaml = join(dir, "broken.yaml");
    writeFileSync(yaml, "storage: [1,\n");
    expect((await cli(["run", "--config", yaml])).code).toBe(2);
    expect((await cli(["run", "--log-level", "chatty", "--data-dir", join(dir, "x")])).code).toBe(2);
    expect((await cli(["run", "--bogus"])).code).toBe(2);
  });

  test("text logs and a config file with its own socket mode and data dir", async () => {
    const dir = tmpDir();
    const cfg = join(dir, "k.yaml");
    writeFileSync(cfg, `name: board-7\nstorage:\n  data_dir: ${dir}/data\napi:\n  socket: ${dir}/k.sock\n  socket_mode: '0600'\nlog:\n  format: text\n  level: debug\n`);
    const agent = await runAgent(dir, ["--config", cfg]);
    expect(agent.logs()).toMatch(/INFO {2}agent started name=board-7/);
    const st = (await (await fetch("http://k/v1/status", { unix: agent.socket } as RequestInit)).json()) as { name: string };
    expect(st.name).toBe("board-7");
    agent.child.proc.kill("SIGTERM");
    expect(await agent.child.proc.exited).toBe(0);
  }, 30_000);

  test("keyop run restarts itself once with the allocator and the JIT tuned; a setting of the user's is kept", async () => {
    const environOf = (pid: number) => readFileSync(`/proc/${pid}/environ`, "utf8").split("\0");
    // Started without the options (undefined leaves them out of the child's environment).
    const unset = { MIMALLOC_PURGE_DELAY: undefined, MIMALLOC_PURGE_HOLES: undefined, MIMALLOC_PURGE_HOLES_MIN_INTERVAL: undefined, [CODE_LEASE_ENV]: undefined, [OPTIMIZED_AGING_ENV]: undefined };
    const tuned = await runAgent(tmpDir(), [], unset as unknown as Record<string, string>);
    // The process that answers is the one started (exec keeps the pid), now with the options set.
    expect(environOf(tuned.child.proc.pid)).toContain(`MIMALLOC_PURGE_DELAY=${PURGE_DELAY_MS}`);
    expect(environOf(tuned.child.proc.pid)).toContain("MIMALLOC_PURGE_HOLES=0");
    expect(environOf(tuned.child.proc.pid)).toContain(`MIMALLOC_PURGE_HOLES_MIN_INTERVAL=${SWEEP_INTERVAL_MS}`);
    expect(environOf(tuned.child.proc.pid)).toContain(`${CODE_LEASE_ENV}=100`);
    expect(environOf(tuned.child.proc.pid)).toContain(`${OPTIMIZED_AGING_ENV}=0`);
    expect(readFileSync(`/proc/${tuned.child.proc.pid}/cmdline`, "utf8").split("\0")).toContain("run");
    tuned.child.proc.kill("SIGTERM");
    expect(await tuned.child.proc.exited).toBe(0);

    const own = await runAgent(tmpDir(), [], { ...unset, MIMALLOC_PURGE_DELAY: "25", [CODE_LEASE_ENV]: "3" } as unknown as Record<string, string>);
    expect(environOf(own.child.proc.pid)).toContain("MIMALLOC_PURGE_DELAY=25");
    expect(environOf(own.child.proc.pid)).toContain(`${CODE_LEASE_ENV}=3`);
    expect(environOf(own.child.proc.pid)).toContain(`${OPTIMIZED_AGING_ENV}=0`);
    expect(environOf(own.child.proc.pid)).toContain("MIMALLOC_PURGE_HOLES=0");
    own.child.proc.kill("SIGTERM");
    expect(await own.child.proc.exited).toBe(0);
  }, 40_000);

  test("a SIGTERM the moment the socket file appears (before start has finished) is still a clean stop", async () => {
    // The socket exists a moment before Agent.start returns (its mode is set after listen); a
    // signal in that moment used to kill the process with the default action (exit 143).
    for (let i = 0; i < 3; i++) {
      const { child, socket, unwatch } = runSignalledAtSocket(["SIGTERM"]);
      expect(await child.proc.exited).toBe(0);
      unwatch();
      await child.done;
      expect(child.stderr()).toContain('"msg":"signal received, shutting down"');
      // A clean stop removes the socket file.
      expect(existsSync(socket)).toBe(false);
    }
  }, 30_000);

  test("SIGHUP and SIGUSR2 the moment the socket file appears do not end the agent", async () => {
    const { child, socket, unwatch } = runSignalledAtSocket(["SIGHUP", "SIGUSR2"]);
    await waitFor(
      async () => {
        if (child.proc.exitCode !== null || child.proc.signalCode !== null) throw new Error(`keyop run ended: exit ${child.proc.exitCode}, signal ${child.proc.signalCode}`);
        try {
          return (await fetch("http://k/healthz", { unix: socket } as RequestInit)).ok;
        } catch {
          return false;
        }
      },
      "agent socket ready",
      20_000,
    );
    unwatch();
    // Both signals were answered, not taken as the default "end the process".
    await waitFor(() => child.stderr().includes("memory after a full collection"), "the SIGUSR2 log line");
    expect(child.proc.exitCode).toBeNull();
    child.proc.kill("SIGTERM");
    expect(await child.proc.exited).toBe(0);
  }, 30_000);

  test("SIGUSR2: a full collection, and the memory after it in the log", async () => {
    const dir = tmpDir();
    const agent = await runAgent(dir);
    // Garbage first: a few thousand messages through the API.
    for (let i = 0; i < 50; i++) {
      const body = Array.from({ length: 100 }, (_, j) => JSON.stringify({ type: "t", payload: { i, j, pad: "x".repeat(100) } })).join("\n");
      await fetch("http://k/v1/channels/gc.t/messages", { method: "POST", body, headers: { "content-type": "application/x-ndjson" }, unix: agent.socket } as RequestInit);
    }
    agent.child.proc.kill("SIGUSR2");
    const line = await waitFor(
      () =>
        agent
          .logs()
          .split("\n")
          .find((l) => l.includes("memory after a full collection")),
      "the memory line",
    );
    const m = JSON.parse(line!) as { rss_mb: number; heap_used_mb: number; external_mb: number };
    expect(m.rss_mb).toBeGreaterThan(10);
    expect(m.heap_used_mb).toBeGreaterThan(0);
    expect(m.heap_used_mb).toBeLessThan(m.rss_mb);
    expect(m.external_mb).toBeGreaterThanOrEqual(0);
    // Still serving, and a signal is not a stop.
    expect((await fetch("http://k/healthz", { unix: agent.socket } as RequestInit)).ok).toBe(true);
    agent.child.proc.kill("SIGTERM");
    expect(await agent.child.proc.exited).toBe(0);
  }, 30_000);
});
