import { describe, expect, test } from "bun:test";
import { Histogram } from "../../src/observability/histogram.ts";
import { createLogger } from "../../src/observability/logger.ts";

describe("Histogram", () => {
  test("percentiles are within bucket resolution (~9%) of the exact values", () => {
    const h = new Histogram();
    const values = Array.from({ length: 10_000 }, (_, i) => (i + 1) / 100); // 0.01 .. 100 ms
    for (const v of values) h.record(v);
    const s = h.summary();
    expect(s.count).toBe(10_000);
    for (const [q, exact] of [
      [s.p50, 50],
      [s.p90, 90],
      [s.p99, 99],
    ] as const) {
      expect(q).toBeGreaterThanOrEqual(exact);
      expect(q).toBeLessThanOrEqual(exact * 1.1);
    }
    expect(s.max).toBe(100);
    expect(s.mean).toBeCloseTo(50.005, 3);
  });

  test("cumulative counts for exposition", () => {
    const h = new Histogram();
    for (const v of [0.5, 0.9, 2, 4, 100]) h.record(v);
    expect(h.cumulative([1, 5, 1000]).map((b) => b.count)).toEqual([2, 4, 5]);
  });

  test("empty and invalid inputs", () => {
    const h = new Histogram();
    h.record(NaN);
    h.record(-1);
    expect(h.summary()).toMatchObject({ count: 0, p99: 0, max: 0 });
  });
});

describe("logger", () => {
  test("json and text lines, level filter", () => {
    const lines: string[] = [];
    const j = createLogger({ level: "warn", write: (l) => lines.push(l), base: { name: "dev1" } });
    j.info("dropped");
    j.warn("kept", { n: 1 });
    expect(lines.length).toBe(1);
    expect(JSON.parse(lines[0]!)).toMatchObject({ level: "warn", msg: "kept", name: "dev1", n: 1 });
    const t = createLogger({ format: "text", write: (l) => lines.push(l) });
    t.error("bad thing", { path: "/x y" });
    expect(lines[1]).toMatch(/ERROR bad thing path="\/x y"$/);
  });
});
