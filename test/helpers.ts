/**
 * Shared test helpers: temporary directories, condition waits with deadlines
 * (never fixed sleeps), and child processes whose stdout lines we collect.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll } from "bun:test";

const made: string[] = [];
const children = new Set<ReturnType<typeof Bun.spawn>>();
// Bun shares this module between test files, so the afterAll below may cover only the first one:
// at the very least nothing outlives the test run.
process.on("exit", () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
});
afterAll(() => {
  // A test that failed half way never stopped its children: nothing outlives the test file.
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  if (process.env.KEEP_TMP) return;
  for (const d of made) rmSync(d, { recursive: true, force: true });
});

/** A fresh temporary directory, removed after the test file. */
export function tmpDir(prefix = "keyop-test-"): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  made.push(d);
  return d;
}

/** Polls `cond` until it is truthy or `timeoutMs` passes (then throws with `what`). */
export async function waitFor<T>(cond: () => T | Promise<T>, what: string, timeoutMs = 10_000, everyMs = 5): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  while (true) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await Bun.sleep(everyMs);
  }
}

/** A child process with its stdout split into lines as they arrive. */
export interface LineChild {
  proc: ReturnType<typeof Bun.spawn>;
  lines: string[];
  stderr: () => string;
  /** Resolves when stdout ended (the process exited or was killed). */
  done: Promise<void>;
}

/** Spawns `cmd` and collects stdout lines into `lines`. */
export function spawnLines(cmd: string[], env: Record<string, string> = {}): LineChild {
  const proc = Bun.spawn(cmd, { stdout: "pipe", stderr: "pipe", env: { ...process.env, ...env } });
  children.add(proc);
  void proc.exited.then(() => children.delete(proc));
  const lines: string[] = [];
  let err = "";
  const decoder = new TextDecoder();
  const readOut = (async () => {
    let rest = "";
    for await (const chunk of proc.stdout as ReadableStream<Uint8Array>) {
      rest += decoder.decode(chunk, { stream: true });
      const parts = rest.split("\n");
      rest = parts.pop()!;
      lines.push(...parts);
    }
    if (rest) lines.push(rest);
  })();
  const readErr = (async () => {
    for await (const chunk of proc.stderr as ReadableStream<Uint8Array>) err += decoder.decode(chunk);
  })();
  return { proc, lines, stderr: () => err, done: Promise.all([readOut, readErr]).then(() => {}) };
}

/** The bun executable running this test (child processes use the same one). */
export const BUN = process.execPath;

export { freePort } from "./ports.ts";

import { Agent } from "../src/agent/agent.ts";
import { parseConfig } from "../src/config/schema.ts";
import { silentLogger, type Logger } from "../src/observability/logger.ts";

/** An in-process agent on a fresh data directory, with helpers to call its API. */
export interface TestAgent {
  agent: Agent;
  dir: string;
  socket: string;
  /** One HTTP request over the socket. */
  call(method: string, path: string, body?: string | Uint8Array, headers?: Record<string, string>): Promise<Response>;
  stop(): Promise<void>;
}

/** Starts an agent with `yaml`-shaped config overrides (data_dir and socket are set here). */
export async function startTestAgent(raw: Record<string, unknown> = {}, logger: Logger = silentLogger, dir = tmpDir()): Promise<TestAgent> {
  const storage = { ...(raw.storage as object), data_dir: join(dir, "data") };
  const api = { ...(raw.api as object), socket: join(dir, "k.sock") };
  const cfg = parseConfig({ name: "test-agent", ...raw, storage, api });
  const agent = await Agent.start(cfg, logger);
  const socket = cfg.api.socket;
  return {
    agent,
    dir,
    socket,
    call: (method, path, body, headers = {}) =>
      fetch(`http://keyop${path}`, { method, body, headers: body !== undefined ? { "content-type": "application/json", ...headers } : headers, unix: socket } as RequestInit),
    stop: () => agent.stop(),
  };
}

/** Path of the CLI entry for child processes. */
export const MAIN = join(import.meta.dir, "..", "src", "main.ts");

/** A small seeded generator (mulberry32) for randomized tests, so that a failure can be run again. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
