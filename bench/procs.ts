/**
 * Starting and stopping the servers a benchmark drives (keyop agents,
 * Mosquitto, nats-server): spawn, wait until it answers, stop and wait for
 * the exit. One helper for every benchmark, so none leaves a process behind.
 */

export type Proc = ReturnType<typeof Bun.spawn>;

/** Polls `cond` every 20 ms until true; throws after `ms`. */
export async function until(what: string, cond: () => Promise<boolean>, ms = 60_000, everyMs = 20): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`);
    await Bun.sleep(everyMs);
  }
}

/** Ready when a TCP connection to `port` on loopback opens. */
export function portOpen(port: number): () => Promise<boolean> {
  return async () => {
    try {
      const s = await Bun.connect({ hostname: "127.0.0.1", port, socket: { data() {} } });
      s.end();
      return true;
    } catch {
      return false;
    }
  };
}

/** Ready when the keyop agent on `socket` answers /healthz. */
export function agentHealthy(socket: string): () => Promise<boolean> {
  return async () => {
    try {
      return (await fetch("http://k/healthz", { unix: socket } as RequestInit)).ok;
    } catch {
      return false;
    }
  };
}

/** Spawns `cmd` and waits until `ready`; registered in `group` (if given) until stopped. */
export async function spawnReady(
  cmd: string[],
  ready: () => Promise<boolean>,
  what: string,
  opts: { stderr?: "inherit" | "ignore" | ReturnType<typeof Bun.file>; group?: Set<Proc>; env?: Record<string, string> } = {},
): Promise<Proc> {
  const proc = Bun.spawn(cmd, { stdout: "ignore", stderr: opts.stderr ?? "ignore", env: opts.env ? { ...process.env, ...opts.env } : undefined });
  opts.group?.add(proc);
  try {
    await until(
      `${what} ready`,
      async () => {
        if (proc.exitCode !== null) throw new Error(`${what} exited with ${proc.exitCode} before it was ready`);
        return ready();
      },
      20_000,
    );
  } catch (err) {
    await stopProc(proc, "SIGKILL", opts.group);
    throw err;
  }
  return proc;
}

/** Signals `proc` and waits for it to exit. */
export async function stopProc(proc: Proc, signal: "SIGTERM" | "SIGKILL" = "SIGTERM", group?: Set<Proc>): Promise<void> {
  proc.kill(signal);
  await proc.exited;
  group?.delete(proc);
}
