/**
 * What this process did, read from /proc: minor page faults, voluntary
 * context switches and CPU by kind of thread. For the in-process path
 * benchmarks (hub-path.ts, mqtt-path.ts).
 */
import { readdirSync, readFileSync } from "node:fs";

/** Minor page faults (/proc/self/stat) and voluntary context switches of all threads so far. */
export function faults(): { minor: number; switches: number } {
  const stat = readFileSync("/proc/self/stat", "utf8");
  const minor = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[7]);
  let switches = 0;
  for (const t of readdirSync("/proc/self/task")) {
    try {
      const m = /voluntary_ctxt_switches:\s+(\d+)/.exec(readFileSync(`/proc/self/task/${t}/status`, "utf8"));
      switches += Number(m?.[1] ?? 0);
    } catch {
      // a thread that ended meanwhile
    }
  }
  return { minor, switches };
}

/** CPU ms of each thread kind so far (schedstat), by thread name. */
export function threadTimes(): Record<string, number> {
  const out: Record<string, number> = {};
  for (const t of readdirSync("/proc/self/task")) {
    try {
      const comm = readFileSync(`/proc/self/task/${t}/comm`, "utf8")
        .trim()
        .replace(/[0-9]+$/, "");
      const ns = Number(readFileSync(`/proc/self/task/${t}/schedstat`, "utf8").split(" ")[0]);
      out[comm] = Math.round((out[comm] ?? 0) + ns / 1e6);
    } catch {
      // a thread that ended meanwhile
    }
  }
  return out;
}
