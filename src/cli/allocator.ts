/**
 * Allocator tuning for the long-running agent.
 *
 * Bun's buffers come from mimalloc, which by default hands pages back to the
 * kernel 10 ms after they empty. An agent under steady load allocates and
 * frees buffers (socket reads, envelopes, record batches) at tens of MB/s,
 * so those pages come straight back, each through a page fault, and the
 * faults showed as a large share of an ingest's event-loop time. Holding
 * empty pages for 10 s instead removes most of them, while memory still
 * goes back to the kernel once a burst is over (the figures are in
 * docs/benchmarks.md).
 *
 * mimalloc reads its options from the environment once, when the process
 * starts, so `keyop run` re-executes itself (same pid, same open files) with
 * the option set. A `MIMALLOC_PURGE_DELAY` already in the environment is
 * left alone: that is also how to opt out (`MIMALLOC_PURGE_DELAY=10` is
 * mimalloc's own default).
 */

/** Milliseconds mimalloc keeps an empty page before returning it to the kernel. */
export const PURGE_DELAY_MS = 10_000;

/** The environment variable mimalloc reads the purge delay from. */
export const PURGE_DELAY_ENV = "MIMALLOC_PURGE_DELAY";

/** What the re-executed process runs: the executable and its arguments. */
export interface ExecPlan {
  file: string;
  args: string[];
}

/**
 * The command that starts this same process again, or null when there is
 * nothing to do (the option is already set). `main` is `Bun.main`: in a
 * compiled binary it is a path inside the binary (`/$bunfs/...`) that must
 * not be passed back as an argument.
 */
export function reexecPlan(env: Record<string, string | undefined>, execPath: string, execArgv: readonly string[], argv: readonly string[], main: string): ExecPlan | null {
  if (env[PURGE_DELAY_ENV] !== undefined) return null;
  const compiled = main.startsWith("/$bunfs/") || main.startsWith("B:/~BUN/");
  const args = compiled ? [execPath, ...argv.slice(2)] : [execPath, ...execArgv, ...argv.slice(1)];
  return { file: execPath, args };
}

/**
 * Re-executes the process with the allocator option set; returns only if
 * that is not needed or not possible (then the agent runs untuned and says
 * so on stderr).
 */
export function tuneAllocator(): void {
  const plan = reexecPlan(process.env, process.execPath, process.execArgv, process.argv, Bun.main);
  if (!plan) return;
  const proc = process as { execve?: (file: string, args: string[], env: Record<string, string | undefined>) => never };
  if (typeof proc.execve !== "function") return;
  try {
    proc.execve(plan.file, plan.args, { ...process.env, [PURGE_DELAY_ENV]: String(PURGE_DELAY_MS) });
  } catch (err) {
    process.stderr.write(`keyop run: could not restart with ${PURGE_DELAY_ENV}=${PURGE_DELAY_MS} (${err instanceof Error ? err.message : String(err)}); running with the allocator's defaults\n`);
  }
}
