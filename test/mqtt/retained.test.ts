import { describe, expect, test } from "bun:test";
import { readdirSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { RetainedStore } from "../../src/mqtt/retained.ts";
import { tmpDir } from "../helpers.ts";

const text = (b: Uint8Array) => new TextDecoder().decode(b);
const all = (s: RetainedStore) => s.matching(() => true).map(([c, r]) => [c, text(r.payload), r.qos]);

describe("RetainedStore", () => {
  test("keeps the last payload and its QoS per channel across a reopen; QoS 2 is kept as 1", async () => {
    const dir = join(tmpDir(), "retained");
    const s = await RetainedStore.open(dir);
    await s.set("home.door", new TextEncoder().encode("closed"), 1);
    await s.set("home.door", new TextEncoder().encode("open"), 2);
    await s.set("home.light", new TextEncoder().encode("on"), 0);
    expect(all(s)).toEqual([
      ["home.door", "open", 1],
      ["home.light", "on", 0],
    ]);
    expect(all(await RetainedStore.open(dir)).sort()).toEqual([
      ["home.door", "open", 1],
      ["home.light", "on", 0],
    ]);
    expect(readdirSync(dir).sort()).toEqual(["home.door.retained1", "home.light.retained"]);
  });

  test("a new QoS replaces the file of the old one; an empty payload clears both", async () => {
    const dir = join(tmpDir(), "retained");
    const s = await RetainedStore.open(dir);
    await s.set("a.b", new TextEncoder().encode("one"), 1);
    await s.set("a.b", new TextEncoder().encode("zero"), 0);
    expect(readdirSync(dir)).toEqual(["a.b.retained"]);
    expect(all(await RetainedStore.open(dir))).toEqual([["a.b", "zero", 0]]);
    await s.set("a.b", new Uint8Array(0), 1);
    expect(readdirSync(dir)).toEqual([]);
    expect(all(await RetainedStore.open(dir))).toEqual([]);
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
