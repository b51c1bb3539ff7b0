import { describe, expect, test } from "bun:test";
import { PURGE_DELAY_ENV, PURGE_HOLES_ENV, reexecPlan, SWEEP_INTERVAL_ENV } from "../../src/cli/allocator.ts";

const all = { [PURGE_DELAY_ENV]: "10000", [PURGE_HOLES_ENV]: "0", [SWEEP_INTERVAL_ENV]: "10000" };

describe("allocator tuning: the re-exec plan", () => {
  test("from source: the runtime, its flags, the script and the arguments, with every option", () => {
    const plan = reexecPlan({}, "/usr/bin/bun", ["--smol"], ["/usr/bin/bun", "/app/src/main.ts", "run", "--config", "k.yaml"], "/app/src/main.ts");
    expect(plan).toEqual({ file: "/usr/bin/bun", args: ["/usr/bin/bun", "--smol", "/app/src/main.ts", "run", "--config", "k.yaml"], set: all });
  });

  test("compiled binary: the path inside the binary is not passed back as an argument", () => {
    const plan = reexecPlan({}, "/usr/local/bin/keyop", [], ["bun", "/$bunfs/root/keyop", "run", "--config", "/etc/keyop/keyop.yaml"], "/$bunfs/root/keyop");
    expect(plan).toEqual({ file: "/usr/local/bin/keyop", args: ["/usr/local/bin/keyop", "run", "--config", "/etc/keyop/keyop.yaml"], set: all });
  });

  test("an option already in the environment is kept; only the missing ones are set", () => {
    const plan = reexecPlan({ [PURGE_DELAY_ENV]: "10" }, "/usr/bin/bun", [], ["/usr/bin/bun", "/app/src/main.ts", "run"], "/app/src/main.ts");
    expect(plan?.set).toEqual({ [PURGE_HOLES_ENV]: "0", [SWEEP_INTERVAL_ENV]: "10000" });
  });

  test("every option already in the environment: no re-exec (and no loop)", () => {
    const env = { [PURGE_DELAY_ENV]: "10", [PURGE_HOLES_ENV]: "1", [SWEEP_INTERVAL_ENV]: "100" };
    expect(reexecPlan(env, "/usr/bin/bun", [], ["/usr/bin/bun", "/app/src/main.ts", "run"], "/app/src/main.ts")).toBeNull();
  });
});
