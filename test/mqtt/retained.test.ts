import { describe, expect, test } from "bun:test";
import { readdirSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { RetainedStore } from "../../src/mqtt/retained.ts";
import { tmpDir } from "../helpers.ts";

const text = (b: Uint8Array) => new TextDecoder().decode(b);
const all = (s: RetainedStore) => s.matching(() => true).map(([c, r]) => [c, text(r.payload), r.qos]);

describe("RetainedStore", () => {
  test("keeps the last payload, its QoS (0, 1 or 2) and its properties per channel across a reopen", async () => {
    const dir = join(tmpDir(), "retained");
    const s = await RetainedStore.open(dir);
    await s.set("home.door", new TextEncoder().encode("closed"), 1);
    await s.set("home.door", new TextEncoder().encode("open"), 2, { headers: [["by", "sensor"]], contentType: "text/plain" });
    await s.set("home.light", new TextEncoder().encode("on"), 0);
    expect(all(s)).toEqual([
      ["home.door", "open", 2],
      ["home.light", "on", 0],
    ]);
    const again = await RetainedStore.open(dir);
    expect(all(again).sort()).toEqual([
      ["home.door", "open", 2],
      ["home.light", "on", 0],
    ]);
    expect(again.matching((c) => c === "home.door")[0]![1].meta).toEqual({ headers: [["by", "sensor"]], contentType: "text/plain" });
    expect(again.matching((c) => c === "home.light")[0]![1].meta).toBeNull();
    expect(readdirSync(dir).sort()).toEqual(["home.door.rmsg", "home.light.rmsg"]);
  });

  test("an empty payload clears a channel's retained message; files of the first format are read and replaced", async () => {
    const dir = join(tmpDir(), "retained");
    const s = await RetainedStore.open(dir);
    await s.set("a.b", new TextEncoder().encode("one"), 1);
    await s.set("a.b", new Uint8Array(0), 1);
    expect(readdirSync(dir)).toEqual([]);
    expect(all(await RetainedStore.open(dir))).toEqual([]);
    writeFileSync(join(dir, "old.one.retained1"), "kept by 0.1");
    const t = await RetainedStore.open(dir);
    expect(all(t)).toEqual([["old.one", "kept by 0.1", 1]]);
    await t.set("old.one", new TextEncoder().encode("new"), 0);
    expect(readdirSync(dir)).toEqual(["old.one.rmsg"]);
  });

  test("an expired retained message is not delivered, and is gone after a reopen", async () => {
    const dir = join(tmpDir(), "retained");
    const s = await RetainedStore.open(dir);
    const now = Date.now();
    await s.set("exp.soon", new TextEncoder().encode("x"), 1, { expires: now + 1_000 });
    await s.set("exp.later", new TextEncoder().encode("y"), 1, { expires: now + 60_000 });
    expect(s.matching(() => true, now).map(([c]) => c)).toEqual(["exp.soon", "exp.later"]);
    expect(s.matching(() => true, now + 2_000).map(([c]) => c)).toEqual(["exp.later"]);
    const again = await RetainedStore.open(dir, now + 2_000);
    expect(again.matching(() => true, now + 2_000).map(([c]) => c)).toEqual(["exp.later"]);
    expect(readdirSync(dir)).toEqual(["exp.later.rmsg"]);
  });

  test("both files left by a crash mid-replace: the newer one stands and the other goes; so do temp files", async () => {
    const dir = join(tmpDir(), "retained");
    await RetainedStore.open(dir);
    const write = (f: string, body: string, ageS: number) => {
      writeFileSync(join(dir, f), body);
      const t = new Date(Date.now() - ageS * 1000);
      utimesSync(join(dir, f), t, t);
    };
    write("x.y.retained", "old qos 0", 10);
    write("x.y.retained1", "new qos 1", 1);
    write("x.z.retained1", "old qos 1", 10);
    write("x.z.retained", "new qos 0", 1);
    write("x.w.retained.tmp", "partial", 1);
    expect(all(await RetainedStore.open(dir)).sort()).toEqual([
      ["x.y", "new qos 1", 1],
      ["x.z", "new qos 0", 0],
    ]);
    expect(readdirSync(dir).sort()).toEqual(["x.y.retained1", "x.z.retained"]);
  });
});
