/**
 * `keyop run`: the agent in the foreground. SIGTERM/SIGINT stop it cleanly
 * (in-flight publishes finish, cursors are flushed, the socket file goes);
 * a second signal during shutdown exits at once. SIGHUP reads the
 * configuration again and applies what can change while running (as
 * `keyop reload` does); SIGUSR2 runs a full garbage collection and logs the memory after it.
 */
import { Agent } from "../agent/agent.ts";
import { loadConfig } from "../config/schema.ts";
import { createLogger } from "../observability/logger.ts";
import { parseArgs } from "./args.ts";

/** Usage text of `keyop run`. */
export const RUN_USAGE = `usage: keyop run [--config FILE] [--data-dir DIR] [--socket PATH] [--log-level debug|info|warn|error]

Runs the agent: opens the data directory (default ./keyop-data) and serves
the local API on its Unix socket (default <data-dir>/keyop.sock). Without
--config it runs on the embedded defaults (local only).`;

/** Runs the agent until a signal stops it; resolves with the exit code. */
export async function cmdRun(argv: string[]): Promise<number> {
  const p = parseArgs(argv, { config: "string", "data-dir": "string", socket: "string", "log-level": "string" }, 0);
  if (p.help) {
    console.log(RUN_USAGE);
    return 0;
  }
  const overrides = {
    dataDir: p.flags["data-dir"] as string | undefined,
    socket: p.flags.socket as string | undefined,
    logLevel: p.flags["log-level"] as string | undefined,
  };
  const cfg = await loadConfig(p.flags.config as string | undefined, overrides);
  const logger = createLogger({ level: cfg.log.level, format: cfg.log.format });
  // Every signal the agent answers is taken before it starts: the API socket answers a moment
  // before Agent.start returns, and a signal in that moment (or during a long start) would
  // otherwise get the default action, which for all four is to end the process. A stop signal
  // during start stops the agent once it is up; SIGHUP and SIGUSR2 then have nothing to act on
  // (the TLS files are read by the start itself).
  let agent: Agent | undefined;
  let stopping = false;
  let finish: (code: number) => void = () => {};
  const done = new Promise<number>((resolve) => (finish = resolve));
  const shutdown = (a: Agent) =>
    a.stop().then(
      () => finish(0),
      (err) => {
        logger.error("shutdown failed", { error: String(err) });
        finish(1);
      },
    );
  const stop = (signal: string) => {
    if (stopping) {
      logger.warn("second signal during shutdown, exiting now", { signal });
      process.exit(1);
    }
    stopping = true;
    logger.info("signal received, shutting down", { signal });
    if (agent) void shutdown(agent);
  };
  const handlers: [NodeJS.Signals, () => void][] = [
    ["SIGTERM", () => stop("SIGTERM")],
    ["SIGINT", () => stop("SIGINT")],
    ["SIGHUP", () => void agent?.reload()],
    // SIGUSR2: a full garbage collection now, and the memory after it in the log. For whoever
    // chases the memory of a board's agent: RSS between collections swings by tens of MB.
    [
      "SIGUSR2",
      () => {
        Bun.gc(true);
        const m = process.memoryUsage();
        const mb = (n: number) => Math.round((n / 1048576) * 10) / 10;
        logger.info("memory after a full collection", { rss_mb: mb(m.rss), heap_used_mb: mb(m.heapUsed), external_mb: mb(m.external) });
      },
    ],
  ];
  for (const [sig, fn] of handlers) process.on(sig, fn);
  try {
    agent = await Agent.start(cfg, logger);
    agent.configSource = () => loadConfig(p.flags.config as string | undefined, overrides);
  } catch (err) {
    for (const [sig, fn] of handlers) process.off(sig, fn);
    throw err;
  }
  if (stopping) void shutdown(agent);
  return done;
}
