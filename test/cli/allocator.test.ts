import { describe, expect, test } from "bun:test";
import { PURGE_DELAY_ENV, PURGE_HOLES_ENV, reexecPlan } from "../../src/cli/allocator.ts";

const both = { [PURGE_DELAY_ENV]: "10000", [PURGE_HOLES_ENV]: "0" };

describe("allocator tuning: the re-exec plan", () => {
  test("from source: the runtime, its flags, the script and the arguments, with both options", () => {
    const plan = reexecPlan({}, "/usr/bin/bun", ["--smol"], ["/usr/bin/bun", "/app/src/main.ts", "run", "--config", "k.yaml"], "/app/src/main.ts");
    expect(plan).toEqual({ file: "/usr/bin/bun", args: ["/usr/bin/bun", "--smol", "/app/src/main.ts", "run", "--config", "k.yaml"], set: both });
  });

  test("compiled binary: the path inside the binary is not passed back as an argument", () => {
    const plan = reexecPlan({}, "/usr/local/bin/keyop", [], ["bun", "/$bunfs/root/keyop", "run", "--config", "/etc/keyop/keyop.yaml"], "/$bunfs/root/keyop");
    expect(plan).toEqual({ file: "/usr/local/bin/keyop", args: ["/usr/local/bin/keyop", "run", "--config", "/etc/keyop/keyop.yaml"], set: both });
  });

  test("an option already in the environment is kept; only the missing one is set", () => {
    const plan = reexecPlan({ [PURGE_DELAY_ENV]: "10" }, "/usr/bin/bun", [], ["/usr/bin/bun", "/app/src/main.ts", "run"], "/app/src/main.ts");
    expect(plan?.set).toEqual({ [PURGE_HOLES_ENV]: "0" });
  });

  test("both already in the environment: no re-exec (and no loop)", () => {
    expect(reexecPlan({ [PURGE_DELAY_ENV]: "10", [PURGE_HOLES_ENV]: "1" }, "/usr/bin/bun", [], ["/usr/bin/bun", "/app/src/main.ts", "run"], "/app/src/main.ts")).toBeNull();
  });
});
