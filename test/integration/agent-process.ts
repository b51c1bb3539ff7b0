/**
 * Helpers for tests that run `keyop run` as a real child process.
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import { BUN, MAIN, spawnLines, waitFor, type LineChild } from "../helpers.ts";

/** A `keyop run` child with its socket and data directory. */
export interface AgentProc {
  child: LineChild;
  socket: string;
  dataDir: string;
  /** stderr so far (JSON log lines). */
  logs(): string;
}

/** Starts `keyop run` on `dir` and waits until its socket answers /healthz. */
export async function runAgent(dir: string, extra: string[] = [], env: Record<string, string> = {}): Promise<AgentProc> {
  const dataDir = join(dir, "data");
  const socket = join(dir, "k.sock");
  const child = spawnLines([BUN, MAIN, "run", "--data-dir", dataDir, "--socket", socket, ...extra], env);
  await waitFor(
    async () => {
      if (child.proc.exitCode !== null || child.proc.signalCode !== null) throw new Error(`keyop run ended (exit ${child.proc.exitCode}, signal ${child.proc.signalCode}): ${child.stderr()}`);
      if (!existsSync(socket)) return false;
      try {
        return (await fetch("http://k/healthz", { unix: socket } as RequestInit)).ok;
      } catch {
        return false;
      }
    },
    "agent socket ready",
    20_000,
    20,
  );
  return { child, socket, dataDir, logs: child.stderr };
}

/** Runs the CLI to completion; returns exit code, stdout and stderr. */
export async function cli(args: string[], opts: { env?: Record<string, string>; stdin?: string } = {}): Promise<{ code: number; out: string; err: string }> {
  const proc = Bun.spawn([BUN, MAIN, ...args], {
    stdin: opts.stdin !== undefined ? new TextEncoder().encode(opts.stdin) : "ignore",
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, ...opts.env },
  });
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  return { code, out, err };
}

/**
 * Makes a CA and certificates for `names` with `keyop cert` in `<dir>/pki`;
 * returns a function giving the `tls:` YAML block of one of them.
 */
export async function fleet(dir: string, names: string[]): Promise<(name: string) => string> {
  const pki = join(dir, "pki");
  const ca = await cli(["cert", "ca", "--out-dir", pki]);
  if (ca.code !== 0) throw new Error(`keyop cert ca failed: ${ca.err}`);
  for (const n of names) {
    const r = await cli(["cert", "issue", "--name", n, "--ca-dir", pki, "--out-dir", pki, "--ip", "127.0.0.1"]);
    if (r.code !== 0) throw new Error(`keyop cert issue ${n} failed: ${r.err}`);
  }
  return (n) => `tls:\n  cert: ${pki}/${n}.crt\n  key: ${pki}/${n}.key\n  ca: ${pki}/ca.crt\n`;
}
