import { describe, expect, test } from "bun:test";
import { mkdirSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { AuditLog } from "../../src/federation/audit.ts";
import { RecentIds, slotKey } from "../../src/federation/dedup.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { rng, tmpDir } from "../helpers.ts";

describe("RecentIds", () => {
  test("remembers up to capacity, evicting the least recently seen", () => {
    const r = new RecentIds(3);
    expect(["a", "b", "c"].map((id) => r.seen(id))).toEqual([false, false, false]);
    expect(r.seen("a")).toBe(true); // refreshes a: b is now the oldest
    expect(r.seen("d")).toBe(false); // evicts b
    expect(r.has("b")).toBe(false);
    expect(r.seen("c")).toBe(true);
    expect(r.size).toBe(3);
    expect(r.seen("b")).toBe(false);
  });

  test("capacity 0 turns it off", () => {
    const r = new RecentIds(0);
    expect(r.seen("x")).toBe(false);
    expect(r.seen("x")).toBe(false);
  });

  test("stays bounded under a flood", () => {
    const r = new RecentIds(1000);
    for (let i = 0; i < 100_000; i++) r.seen(`id-${i}`);
    expect(r.size).toBe(1000);
    expect(r.has("id-99999")).toBe(true);
    expect(r.has("id-98999")).toBe(false);
  });

  test("UUIDs across several chunks of its ring, wrapping around: the last capacity ids are remembered, none before", () => {
    const cap = 40_000;
    const r = new RecentIds(cap);
    const ids = Array.from({ length: 100_000 }, () => Bun.randomUUIDv7());
    for (const id of ids) expect(r.seen(id)).toBe(false);
    expect(r.size).toBe(cap);
    for (let i = 0; i < ids.length; i++) expect(r.has(ids[i]!)).toBe(i >= ids.length - cap);
  });

  test("ids that do not fit a slot (long, or not ASCII) are remembered too, and bounded", () => {
    const r = new RecentIds(3);
    const long = (i: number) => `${"x".repeat(60)}-${i}`;
    for (const id of [long(1), "é-1", "short", long(2)]) expect(r.seen(id)).toBe(false);
    for (const id of [long(1), "é-1", "short", long(2)]) expect(r.has(id)).toBe(true);
    expect(r.seen("é-1")).toBe(true);
    for (let i = 3; i < 10; i++) r.seen(long(i));
    expect(r.has(long(1))).toBe(false);
    expect(r.has("short")).toBe(true);
  });

  test("two ids of one hash: each is checked against the stored bytes, the newer one is remembered, and the older one's slot leaves it alone", () => {
    const keyOf = (id: string) => (id === "a" || id === "b" ? 42 : slotKey(id));
    const r = new RecentIds(3, keyOf);
    expect(r.seen("a")).toBe(false);
    expect(r.seen("b")).toBe(false); // not taken for "a"
    expect(r.has("a")).toBe(false); // forgotten: at worst a duplicate goes through, nothing is dropped
    expect(r.seen("c")).toBe(false);
    expect(r.seen("d")).toBe(false); // takes "a"'s slot, which must not forget "b"
    expect(r.has("b")).toBe(true);
    expect(r.seen("b")).toBe(true);
  });

  test("ids that differ in one character or in length are told apart; the same id again is a duplicate", () => {
    const r = new RecentIds(100);
    const base = "0190c1e2-7a3b-7c4d-8e5f-6a7b8c9d0e1f";
    expect(r.seen(base)).toBe(false);
    for (let i = 0; i < base.length; i++) {
      const other = base.slice(0, i) + (base[i] === "a" ? "b" : "a") + base.slice(i + 1);
      expect(r.has(other)).toBe(false);
    }
    expect(r.has(base.slice(0, -1))).toBe(false);
    expect(r.has(`${base}0`)).toBe(false);
    expect(r.seen(base)).toBe(true);
    // With its hash passed back, as a receiver does for a batch.
    expect(r.has(base, r.hash(base))).toBe(true);
    expect(r.seen(`${base}0`, r.hash(`${base}0`))).toBe(false);
    expect(r.has(`${base}0`)).toBe(true);
  });

  test("against a plain Map of the same capacity, in random order with repeats: never a duplicate the Map would not call one; every id of the last capacity sightings remembered", () => {
    const cap = 500;
    const r = new RecentIds(cap);
    const model = new Map<string, true>();
    const rand = rng(7);
    const sightings: string[] = [];
    let duplicates = 0;
    for (let i = 0; i < 50_000; i++) {
      const id = `m-${Math.floor(rand() * 2000)}`;
      sightings.push(id);
      const want = model.has(id);
      model.delete(id);
      model.set(id, true);
      if (model.size > cap) model.delete(model.keys().next().value!);
      // A refreshed id leaves its old slot behind, so the ring may remember fewer ids than the Map.
      const got = r.seen(id);
      if (got) {
        expect(want).toBe(true);
        duplicates++;
      }
    }
    expect(duplicates).toBeGreaterThan(5_000);
    for (const id of sightings.slice(-cap)) expect(r.has(id)).toBe(true);
  });
});

describe("AuditLog", () => {
  test("JSON lines in order, rotated by size, keeping max_files", async () => {
    const dir = tmpDir();
    const path = join(dir, "audit.log");
    const a = new AuditLog({ path, maxFileBytes: 2000, maxFiles: 3, logger: silentLogger });
    for (let i = 0; i < 100; i++) a.record("policy_violation", { peer: "dev1", channel: `c.${i}`, reason: "not allowed" });
    await a.flush();
    expect(readdirSync(dir).sort()).toEqual(["audit.log", "audit.log.1", "audit.log.2"]);
    const lines = ["audit.log.2", "audit.log.1", "audit.log"].flatMap((f) => readFileSync(join(dir, f), "utf8").trim().split("\n")).map((l) => JSON.parse(l));
    for (const f of readdirSync(dir)) expect(readFileSync(join(dir, f)).length).toBeLessThanOrEqual(2000);
    // the newest lines survive, in order, each a complete event
    const nums = lines.map((l) => Number(l.channel.slice(2)));
    expect(nums).toEqual([...nums].sort((x, y) => x - y));
    expect(nums.at(-1)).toBe(99);
    expect(lines[0]).toMatchObject({ event: "policy_violation", peer: "dev1", reason: "not allowed" });
    expect(typeof lines[0].time).toBe("string");
  });

  test("a trail that cannot be written is retried with the lines kept, and written whole once it can be", async () => {
    const dir = join(tmpDir(), "later");
    const path = join(dir, "audit.log");
    const a = new AuditLog({ path, maxFileBytes: 100_000, maxFiles: 2, logger: silentLogger });
    a.record("peer_rejected", { reason: "x" });
    a.record("peer_rejected", { reason: "y" });
    // The directory is missing: the caller is not held up, the lines wait.
    await a.flush(300);
    expect(a.failedWriteCount).toBeGreaterThan(0);
    expect(a.droppedLines).toBe(0);
    mkdirSync(dir);
    await a.flush(10_000);
    const lines = readFileSync(path, "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(lines.map((l) => l.reason)).toEqual(["x", "y"]);
    // Closing with lines still unwritable drops and counts them.
    const b = new AuditLog({ path: join(tmpDir(), "no", "such", "audit.log"), maxFileBytes: 1000, maxFiles: 2, logger: silentLogger });
    b.record("peer_rejected", { reason: "z" });
    await b.flush(100);
    b.close();
    expect(b.droppedLines).toBe(1);
  });
});
