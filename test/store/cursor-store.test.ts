import { describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { CursorStore, cursorFileName } from "../../src/store/cursor-store.ts";
import { createLogger, silentLogger } from "../../src/observability/logger.ts";
import { tmpDir } from "../helpers.ts";

describe("CursorStore", () => {
  test("cursors survive a reopen; file names escape wildcards", async () => {
    const dir = tmpDir();
    const store = await CursorStore.open(dir, silentLogger, 0);
    const s = store.create("sensors.>", "dash", "latest");
    store.set(s, "sensors.a", 10);
    store.set(s, "sensors.b", 3);
    store.addSkipped(s, "sensors.a", 4);
    await store.close();
    expect(readdirSync(dir)).toEqual([cursorFileName("sensors.>", "dash")]);
    expect(cursorFileName("a.*.b", "n")).toBe("a.%2A.b~n.json");
    const re = await CursorStore.open(dir, silentLogger, 0);
    const back = re.get("sensors.>", "dash")!;
    expect(back.cursors).toEqual({ "sensors.a": 10, "sensors.b": 3 });
    expect(back.skipped).toEqual({ "sensors.a": 4 });
    expect(back.from).toBe("latest");
    await re.close();
  });

  test("acks are batched: nothing is written until a flush", async () => {
    const dir = tmpDir();
    const store = await CursorStore.open(dir, silentLogger, 0);
    const s = store.create("c", "n", "earliest");
    await store.flush();
    const path = join(dir, "c~n.json");
    for (let i = 1; i <= 1000; i++) store.set(s, "c", i);
    expect(JSON.parse(readFileSync(path, "utf8")).cursors).toEqual({});
    await store.flush();
    expect(JSON.parse(readFileSync(path, "utf8")).cursors).toEqual({ c: 1000 });
    await store.close();
  });

  test("the timer flushes dirty cursors by itself", async () => {
    const dir = tmpDir();
    const store = await CursorStore.open(dir, silentLogger, 10);
    store.set(store.create("c", "n", "earliest"), "c", 7);
    const path = join(dir, "c~n.json");
    const deadline = Date.now() + 5000;
    while (!(existsSync(path) && JSON.parse(readFileSync(path, "utf8")).cursors.c === 7) && Date.now() < deadline) await Bun.sleep(5);
    expect(JSON.parse(readFileSync(path, "utf8")).cursors.c).toBe(7);
    await store.close();
  });

  test("each change arms one write: a change after a written one is written too, and nothing is rewritten without one", async () => {
    const dir = tmpDir();
    const store = await CursorStore.open(dir, silentLogger, 10);
    const s = store.create("c", "n", "earliest");
    const path = join(dir, "c~n.json");
    const written = async (seq: number) => {
      const deadline = Date.now() + 5000;
      while (!(existsSync(path) && JSON.parse(readFileSync(path, "utf8")).cursors.c === seq) && Date.now() < deadline) await Bun.sleep(5);
      expect(JSON.parse(readFileSync(path, "utf8")).cursors.c).toBe(seq);
    };
    store.set(s, "c", 1);
    await written(1);
    // Each write is a new file renamed into place: the same inode means nothing was written.
    const ino = statSync(path).ino;
    await Bun.sleep(100);
    expect(statSync(path).ino).toBe(ino);
    expect(store.health().pending).toBe(0);
    store.set(s, "c", 2);
    await written(2);
    expect(statSync(path).ino).not.toBe(ino);
    await store.close();
  });

  test("delete removes the file; a damaged file is set aside, a stale temp file removed", async () => {
    const dir = tmpDir();
    const store = await CursorStore.open(dir, silentLogger, 0);
    store.create("a", "x", "latest");
    store.create("b", "y", "latest");
    await store.flush();
    expect(await store.delete("a", "x")).toBe(true);
    expect(await store.delete("a", "x")).toBe(false);
    await store.close();
    writeFileSync(join(dir, "b~y.json"), "{not json");
    writeFileSync(join(dir, "c~z.json.tmp"), "partial");
    const lines: string[] = [];
    const re = await CursorStore.open(dir, createLogger({ write: (l) => lines.push(l) }), 0);
    expect(re.list()).toEqual([]);
    expect(readdirSync(dir).sort()).toEqual(["b~y.json.corrupt"]);
    expect(lines.some((l) => l.includes("unreadable cursor file"))).toBe(true);
    await re.close();
  });
});
