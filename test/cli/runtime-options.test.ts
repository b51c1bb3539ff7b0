import { describe, expect, test } from "bun:test";
import { CODE_LEASE_ENV, JIT_OPTIONS, OPTIMIZED_AGING_ENV, PURGE_DELAY_ENV, PURGE_HOLES_ENV, reexecPlan, SWEEP_INTERVAL_ENV } from "../../src/cli/runtime-options.ts";
import { BUN } from "../helpers.ts";

const all = { [PURGE_DELAY_ENV]: "10000", [PURGE_HOLES_ENV]: "0", [SWEEP_INTERVAL_ENV]: "10000", [CODE_LEASE_ENV]: "100", [OPTIMIZED_AGING_ENV]: "0" };

describe("runtime tuning: the re-exec plan", () => {
  test("from source: the runtime, its flags, the script and the arguments, with every option", () => {
    const plan = reexecPlan({}, "/usr/bin/bun", ["--smol"], ["/usr/bin/bun", "/app/src/main.ts", "run", "--config", "k.yaml"], "/app/src/main.ts");
    expect(plan).toEqual({ file: "/usr/bin/bun", args: ["/usr/bin/bun", "--smol", "/app/src/main.ts", "run", "--config", "k.yaml"], set: all });
  });

  test("compiled binary: the path inside the binary is not passed back as an argument", () => {
    const plan = reexecPlan({}, "/usr/local/bin/keyop", [], ["bun", "/$bunfs/root/keyop", "run", "--config", "/etc/keyop/keyop.yaml"], "/$bunfs/root/keyop");
    expect(plan).toEqual({ file: "/usr/local/bin/keyop", args: ["/usr/local/bin/keyop", "run", "--config", "/etc/keyop/keyop.yaml"], set: all });
  });

  test("an option already in the environment is kept; only the missing ones are set", () => {
    const plan = reexecPlan({ [PURGE_DELAY_ENV]: "10", [CODE_LEASE_ENV]: "3" }, "/usr/bin/bun", [], ["/usr/bin/bun", "/app/src/main.ts", "run"], "/app/src/main.ts");
    expect(plan?.set).toEqual({ [PURGE_HOLES_ENV]: "0", [SWEEP_INTERVAL_ENV]: "10000", [OPTIMIZED_AGING_ENV]: "0" });
  });

  test("every option already in the environment: no re-exec (and no loop)", () => {
    const env = { [PURGE_DELAY_ENV]: "10", [PURGE_HOLES_ENV]: "1", [SWEEP_INTERVAL_ENV]: "100", [CODE_LEASE_ENV]: "3", [OPTIMIZED_AGING_ENV]: "16" };
    expect(reexecPlan(env, "/usr/bin/bun", [], ["/usr/bin/bun", "/app/src/main.ts", "run"], "/app/src/main.ts")).toBeNull();
  });
});

describe("runtime tuning: the JIT's options", () => {
  // Bun exits at start on a JSC option it does not know; this names the cause when an upgrade drops one.
  test("this Bun knows each of them and starts with them", () => {
    for (const [k, v] of Object.entries(JIT_OPTIONS)) {
      const r = Bun.spawnSync([BUN, "-e", "process.stdout.write('up')"], { env: { ...process.env, [k]: v }, stderr: "pipe" });
      expect({ option: k, stdout: r.stdout.toString(), stderr: r.stderr.toString(), code: r.exitCode }).toEqual({ option: k, stdout: "up", stderr: "", code: 0 });
    }
    const bad = Bun.spawnSync([BUN, "-e", "process.stdout.write('up')"], { env: { ...process.env, BUN_JSC_noSuchOptionForKeyop: "1" }, stderr: "pipe" });
    expect(bad.stdout.toString()).toBe("");
    expect(bad.stderr.toString()).toContain("invalid JSC environment variable");
  });
});
