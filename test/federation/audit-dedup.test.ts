import { describe, expect, test } from "bun:test";
import { mkdirSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { AuditLog } from "../../src/federation/audit.ts";
import { RecentIds } from "../../src/federation/dedup.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { tmpDir } from "../helpers.ts";

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
