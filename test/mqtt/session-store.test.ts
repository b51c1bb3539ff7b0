import { describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { SessionStore } from "../../src/mqtt/session-store.ts";
import { tmpDir } from "../helpers.ts";

const logEnds = new Map([["t.a", 10]]);

describe("SessionStore: sent marks", () => {
  test("after a clean close, a restart knows exactly what each client got", async () => {
    const dir = join(tmpDir(), "sessions");
    const m = await SessionStore.open(dir, new Map());
    m.sending("c1", "t.a", 3);
    m.sending("c1", "t.a", 2); // a lower seq never moves the mark back
    expect(m.sentBefore("c1", "t.a", 3)).toBe(true);
    expect(m.sentBefore("c1", "t.a", 4)).toBe(false);
    await m.close();
    const again = await SessionStore.open(dir, logEnds);
    expect([1, 3, 4, 10].map((s) => again.sentBefore("c1", "t.a", s))).toEqual([true, true, false, false]);
    expect(again.sentBefore("c2", "t.a", 1)).toBe(false);
    await again.close();
  });

  test("after a crash, everything already in the log when keyop started counts as maybe sent", async () => {
    const dir = join(tmpDir(), "sessions");
    const m = await SessionStore.open(dir, new Map());
    m.sending("c1", "t.a", 3);
    // No close: the file on disk still says the run is going on.
    const warned: string[] = [];
    const logger = { debug() {}, info() {}, error() {}, warn: (msg: string) => void warned.push(msg) };
    const after = await SessionStore.open(dir, logEnds, logger);
    expect(warned).toEqual(["mqtt session state not saved cleanly (keyop stopped abruptly): messages stored before this start are sent with DUP"]);
    expect([3, 10, 11].map((s) => after.sentBefore("c1", "t.a", s))).toEqual([true, true, false]);
    expect(after.sentBefore("c9", "t.b", 1)).toBe(false); // a channel empty at start: nothing was sent
    await after.close();
    await m.close();
  });

  test("a damaged file counts as a crash; a dropped client starts over", async () => {
    const dir = join(tmpDir(), "sessions");
    await (await SessionStore.open(dir, new Map())).close();
    writeFileSync(join(dir, "sessions.json"), "{not json");
    const m = await SessionStore.open(dir, logEnds);
    expect(m.sentBefore("c1", "t.a", 10)).toBe(true);
    m.sending("c2", "t.a", 12);
    await m.drop("c2");
    await m.close();
    const clean = await SessionStore.open(dir, logEnds);
    expect(clean.sentBefore("c2", "t.a", 12)).toBe(false);
    await clean.close();
  });
});

describe("SessionStore: expiry", () => {
  test("a disconnected session expires its expiry after the disconnect; a connected one never", async () => {
    const dir = join(tmpDir(), "sessions");
    const s = await SessionStore.open(dir, new Map(), undefined, 0);
    await s.connected("live", 1000);
    await s.disconnected("gone", 1000, 5000);
    await s.disconnected("forever", null, 5000);
    expect(s.expired(5999)).toEqual([]);
    expect(s.expired(6000)).toEqual(["gone"]);
    expect(s.expired(Number.MAX_SAFE_INTEGER).sort()).toEqual(["gone"]);
    await s.close();
    // Kept across a restart; a session connected when keyop stopped starts its expiry at the next start.
    const again = await SessionStore.open(dir, new Map(), undefined, 100_000);
    expect(again.knows("live") && again.knows("gone") && again.knows("forever")).toBe(true);
    expect(again.expired(100_999)).toEqual(["gone"]);
    expect(again.expired(101_000).sort()).toEqual(["gone", "live"]);
    await again.drop("gone");
    expect(again.knows("gone")).toBe(false);
    await again.close();
  });

  test("a burst of connects and disconnects is saved whole, each caller resolved once its change is durable", async () => {
    const dir = join(tmpDir(), "sessions");
    const s = await SessionStore.open(dir, new Map(), undefined, 0);
    await Promise.all(Array.from({ length: 200 }, (_, i) => (i % 2 ? s.disconnected(`c${i}`, 1000, 0) : s.connected(`c${i}`, 1000))));
    // What each awaited is on disk now, before any close.
    const seen = JSON.parse(await Bun.file(join(dir, "sessions.json")).text()) as { sessions: Record<string, unknown> };
    expect(Object.keys(seen.sessions).length).toBe(200);
    await s.close();
  });
});
