import { describe, expect, test } from "bun:test";
import { compilePattern } from "../../src/envelope/names.ts";
import { patternCovers, patternIntersection, patternsOverlap, uncovered } from "../../src/envelope/patterns.ts";

describe("patternCovers", () => {
  const cases: [string, string, boolean][] = [
    [">", "a", true],
    [">", "a.*.>", true],
    ["a.>", "a.b", true],
    ["a.>", "a.>", true],
    ["a.>", "a", false],
    ["a.>", ">", false],
    ["a.*", "a.b", true],
    ["a.*", "a.*", true],
    ["a.*", "a.>", false],
    ["a.*", "a.b.c", false],
    ["a.b", "a.*", false],
    ["a.b", "a.b", true],
    ["a.*.c", "a.x.c", true],
    ["a.*.c", "a.x.d", false],
    ["a.*.>", "a.x.y.z", true],
    ["a.*.>", "a.x", false],
    ["telemetry.>", "cmd.>", false],
  ];
  for (const [outer, inner, want] of cases) {
    test(`${outer} ${want ? "covers" : "does not cover"} ${inner}`, () => expect(patternCovers(outer, inner)).toBe(want));
  }
  test("agrees with the matchers on every channel of a small universe", () => {
    const tokens = ["a", "b"];
    const channels: string[] = [];
    const grow = (prefix: string[], depth: number) => {
      if (prefix.length > 0) channels.push(prefix.join("."));
      if (depth === 0) return;
      for (const t of tokens) grow([...prefix, t], depth - 1);
    };
    grow([], 4);
    const patterns: string[] = [];
    const growP = (prefix: string[], depth: number) => {
      if (prefix.length > 0) patterns.push(prefix.join("."));
      if (depth === 0 || prefix.at(-1) === ">") return;
      for (const t of ["a", "*", ">"]) growP([...prefix, t], depth - 1);
    };
    growP([], 3);
    for (const outer of patterns) {
      const mo = compilePattern(outer);
      for (const inner of patterns) {
        const mi = compilePattern(inner);
        // Within the universe (depth 4 is past every pattern's fixed part), coverage is inclusion.
        const included = channels.filter(mi).every(mo);
        expect(`${outer} ⊇ ${inner}: ${patternCovers(outer, inner)}`).toBe(`${outer} ⊇ ${inner}: ${included}`);
        const overlap = channels.some((c) => mi(c) && mo(c));
        expect(`${outer} ∩ ${inner}: ${patternsOverlap(outer, inner)}`).toBe(`${outer} ∩ ${inner}: ${overlap}`);
      }
    }
  });
  test("uncovered lists each rule no stream covers, once", () => {
    expect(uncovered(["telemetry.>", "cmd.>"], ["telemetry.a", "logs.>", "cmd.*", "logs.>", ">"])).toEqual(["logs.>", ">"]);
  });
});

describe("patternIntersection", () => {
  const cases: [string, string, string | null][] = [
    [">", "cmd.>", "cmd.>"],
    ["cmd.>", ">", "cmd.>"],
    ["cmd.>", "cmd.board-7.>", "cmd.board-7.>"],
    ["cmd.*.reboot", "cmd.board-7.>", "cmd.board-7.reboot"],
    ["cmd.*", "*.x", "cmd.x"],
    ["cmd.>", "telemetry.>", null],
    ["a.b", "a.b.c", null],
    ["a.>", "a", null],
    ["a.*", "a.*", "a.*"],
  ];
  for (const [a, b, want] of cases) test(`${a} ∩ ${b} = ${want}`, () => expect(patternIntersection(a, b)).toBe(want));
  test("matches exactly the channels both match, over a small universe", () => {
    const channels: string[] = [];
    const grow = (prefix: string[], depth: number) => {
      if (prefix.length > 0) channels.push(prefix.join("."));
      if (depth > 0) for (const t of ["a", "b"]) grow([...prefix, t], depth - 1);
    };
    grow([], 4);
    const patterns: string[] = [];
    const growP = (prefix: string[], depth: number) => {
      if (prefix.length > 0) patterns.push(prefix.join("."));
      if (depth === 0 || prefix.at(-1) === ">") return;
      for (const t of ["a", "*", ">"]) growP([...prefix, t], depth - 1);
    };
    growP([], 3);
    for (const a of patterns) {
      for (const b of patterns) {
        const both = channels.filter((c) => compilePattern(a)(c) && compilePattern(b)(c));
        const i = patternIntersection(a, b);
        const got = i === null ? [] : channels.filter(compilePattern(i));
        expect(`${a} ∩ ${b}: ${got.join(" ")}`).toBe(`${a} ∩ ${b}: ${both.join(" ")}`);
      }
    }
  });
});
