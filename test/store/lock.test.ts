import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { Messenger } from "../../src/index.ts";
import { LockedError } from "../../src/errors.ts";
import { BUN, spawnLines, tmpDir, waitFor } from "../helpers.ts";

const fixture = join(import.meta.dir, "../integration/fixtures/hold-lock.ts");

describe("data directory lock", () => {
  test("a second process is refused with a clear error; the lock goes with a SIGKILLed holder", async () => {
    const dir = tmpDir();
    const child = spawnLines([BUN, fixture, dir]);
    await waitFor(() => child.lines.includes("ready"), "holder ready");
    let err: unknown;
    try {
      await Messenger.open({ storage: { dataDir: dir } });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(LockedError);
    expect((err as LockedError).code).toBe("locked");
    expect((err as Error).message).toContain(`pid ${child.proc.pid}`);
    child.proc.kill("SIGKILL");
    await child.proc.exited;
    const m = await Messenger.open({ storage: { dataDir: dir } });
    await m.close();
  });

  test("the same process cannot open one directory twice", async () => {
    const dir = tmpDir();
    const m = await Messenger.open({ storage: { dataDir: dir } });
    await expect(Messenger.open({ storage: { dataDir: dir } })).rejects.toMatchObject({ code: "locked" });
    await m.close();
    const again = await Messenger.open({ storage: { dataDir: dir } });
    await again.close();
  });
});
