/**
 * Runtime tuning for the long-running agent: options that mimalloc and
 * JavaScriptCore read from the environment once, when the process starts,
 * so `keyop run` re-executes itself (same pid, same open files) with them
 * set. An option already in the environment is left as it is: that is also
 * how to opt out (docs/deploy.md gives each default).
 *
 * The allocator. Bun's buffers and its JavaScript heap's blocks come from
 * mimalloc, which by default hands memory back to the kernel soon after it
 * empties: whole pages 10 ms after they empty, and the free parts of pages
 * still in use ("holes") on a 100 ms pass of its scavenger thread. An agent
 * allocates and frees at a steady pace whatever its rate (socket reads,
 * envelopes, records, the collector's blocks), so that memory comes straight
 * back, each page through a page fault, and the scavenger's passes cost CPU
 * of their own. Holding empty pages for 10 s and leaving holes in place
 * removes most of the faults and most of the scavenger's work, for some more
 * resident memory while the load lasts (the figures are in
 * docs/benchmarks.md); memory still goes back to the kernel once a burst is
 * over.
 *
 * Bun's event loop also hands the thread's heaps to the scavenger each time
 * it blocks, and by default the scavenger sweeps them again 100 ms later: an
 * agent with a connected socket blocks every second at least (the runtime's
 * own timers), so an idle agent woke twice as often as its main thread. One
 * sweep per 10 s, the same pace as the purge delay, lets an idle agent sleep
 * and still gives memory back within seconds of a burst.
 *
 * The JIT. JavaScriptCore throws away compiled code that it judges old, to
 * free memory in programs that move on to other work, and an agent never
 * does: at a steady rate the functions of the message path dropped back to
 * the interpreter every minute or so and were compiled again, all the way
 * up, which cost the compiler's threads and the slow tiers' time on the
 * main thread. A code block that still runs now keeps its lease a hundred
 * times its tier's lifetime instead of three, and the optimized code that
 * has no execution counter to show it runs (it could only age out when the
 * process falls quiet) is kept. The code an agent runs is a fixed set, so
 * what that keeps is bounded.
 */

/** Milliseconds mimalloc keeps an empty page before returning it to the kernel. */
export const PURGE_DELAY_MS = 10_000;

/** The environment variable mimalloc reads the purge delay from. */
export const PURGE_DELAY_ENV = "MIMALLOC_PURGE_DELAY";

/** The environment variable of the scavenger's purging of free space inside pages in use. */
export const PURGE_HOLES_ENV = "MIMALLOC_PURGE_HOLES";

/** The environment variable of the shortest time between two sweeps of a thread's heaps by the scavenger. */
export const SWEEP_INTERVAL_ENV = "MIMALLOC_PURGE_HOLES_MIN_INTERVAL";

/** Milliseconds between two sweeps of the event loop's heaps while it sleeps. */
export const SWEEP_INTERVAL_MS = 10_000;

/** The allocator's options the agent sets. */
export const ALLOCATOR_OPTIONS: Readonly<Record<string, string>> = {
  [PURGE_DELAY_ENV]: String(PURGE_DELAY_MS),
  [PURGE_HOLES_ENV]: "0",
  [SWEEP_INTERVAL_ENV]: String(SWEEP_INTERVAL_MS),
};

/** How many of its tier's lifetimes a code block that still runs is kept for (JavaScriptCore's default: 3). */
export const CODE_LEASE_ENV = "BUN_JSC_codeBlockAgingLeaseMultiplier";

/** Allocation between collections that counts as activity for the aging of optimized code; 0: it never ages out. */
export const OPTIMIZED_AGING_ENV = "BUN_JSC_optimizedCodeAgingQuietAllocationMB";

/**
 * The JIT's options the agent sets. Bun refuses to start on a name it does
 * not know, so a Bun that drops one of these fails every test that starts
 * an agent (test/cli/runtime-options.test.ts checks them alone).
 */
export const JIT_OPTIONS: Readonly<Record<string, string>> = {
  [CODE_LEASE_ENV]: "100",
  [OPTIMIZED_AGING_ENV]: "0",
};

/** What the agent sets, unless the environment already says. */
export const RUNTIME_OPTIONS: Readonly<Record<string, string>> = { ...ALLOCATOR_OPTIONS, ...JIT_OPTIONS };

/** What the re-executed process runs: the executable, its arguments, and the options it adds. */
export interface ExecPlan {
  file: string;
  args: string[];
  /** The runtime options not already in the environment. */
  set: Record<string, string>;
}

/**
 * The command that starts this same process again, or null when there is
 * nothing to do (every option is already set). `main` is `Bun.main`: in a
 * compiled binary it is a path inside the binary (`/$bunfs/...`) that must
 * not be passed back as an argument.
 */
export function reexecPlan(env: Record<string, string | undefined>, execPath: string, execArgv: readonly string[], argv: readonly string[], main: string): ExecPlan | null {
  const set: Record<string, string> = {};
  for (const [k, v] of Object.entries(RUNTIME_OPTIONS)) if (env[k] === undefined) set[k] = v;
  if (Object.keys(set).length === 0) return null;
  const compiled = main.startsWith("/$bunfs/") || main.startsWith("B:/~BUN/");
  const args = compiled ? [execPath, ...argv.slice(2)] : [execPath, ...execArgv, ...argv.slice(1)];
  return { file: execPath, args, set };
}

/**
 * Re-executes the process with the runtime options set; returns only if
 * that is not needed or not possible (then the agent runs untuned and says
 * so on stderr).
 */
export function tuneRuntime(): void {
  const plan = reexecPlan(process.env, process.execPath, process.execArgv, process.argv, Bun.main);
  if (!plan) return;
  const proc = process as { execve?: (file: string, args: string[], env: Record<string, string | undefined>) => never };
  if (typeof proc.execve !== "function") return;
  try {
    proc.execve(plan.file, plan.args, { ...process.env, ...plan.set });
  } catch (err) {
    const what = Object.entries(plan.set)
      .map(([k, v]) => `${k}=${v}`)
      .join(" ");
    process.stderr.write(`keyop run: could not restart with ${what} (${err instanceof Error ? err.message : String(err)}); running with the runtime's defaults\n`);
  }
}
