import { describe, expect, test } from "bun:test";
import { assertChannel, assertName, assertPattern, channelProblem, compilePattern, compileRules, deadLetterOf, isDeadLetter } from "../../src/envelope/names.ts";
import { InvalidChannelError, InvalidNameError, InvalidPatternError } from "../../src/errors.ts";

describe("channel names", () => {
  test.each(["a", "sensors.temp", "A-b_c.9", "x".repeat(255), "a.b.c.d.e"])("accepts %p", (name) => {
    expect(channelProblem(name)).toBeNull();
    expect(() => assertChannel(name)).not.toThrow();
  });

  test.each([
    ["", "empty"],
    [".a", "empty token"],
    ["a.", "empty token"],
    ["a..b", "empty token"],
    ["..", "empty token"],
    ["../etc", "empty token"],
    ["a/b", "outside"],
    ["a b", "outside"],
    ["a*", "outside"],
    ["a.>", "outside"],
    ["é", "outside"],
    ["x".repeat(256), "longer"],
  ])("rejects %p (%s)", (name, why) => {
    expect(channelProblem(name)).toContain(why);
    let err: unknown;
    try {
      assertChannel(name);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(InvalidChannelError);
    expect((err as InvalidChannelError).code).toBe("invalid_channel");
  });

  test("non-strings are rejected", () => {
    expect(channelProblem(42)).toBe("channel name must be a string");
    expect(() => assertChannel(undefined)).toThrow(InvalidChannelError);
  });

  test("dead-letter naming", () => {
    expect(deadLetterOf("a.b")).toBe("a.b.dead-letter");
    expect(isDeadLetter("a.b.dead-letter")).toBe(true);
    expect(isDeadLetter("a.dead-letterx")).toBe(false);
  });
});

describe("patterns", () => {
  test.each(["a", "a.*", "*.b", "a.>", ">", "*", "a.*.c.>"])("accepts %p", (p) => {
    expect(() => assertPattern(p)).not.toThrow();
  });
  test.each(["", "a.>.b", ">.a", "a..b", "a.**", "a.b>", "a/b"])("rejects %p", (p) => {
    expect(() => assertPattern(p)).toThrow(InvalidPatternError);
  });

  const cases: [string, string, boolean][] = [
    ["sensors.temp", "sensors.temp", true],
    ["sensors.temp", "sensors.temp2", false],
    ["sensors.*", "sensors.temp", true],
    ["sensors.*", "sensors.temp.x", false],
    ["sensors.*", "sensors", false],
    ["sensors.*.temp", "sensors.a.temp", true],
    ["sensors.*.temp", "sensors.a.hum", false],
    ["sensors.>", "sensors.a", true],
    ["sensors.>", "sensors.a.b.c", true],
    ["sensors.>", "sensors", false],
    [">", "anything.at.all", true],
    ["*", "one", true],
    ["*", "one.two", false],
    // wildcards skip dead-letter channels unless asked for them
    [">", "a.dead-letter", false],
    ["a.*", "a.dead-letter", false],
    ["a.>", "a.b.dead-letter", false],
    ["*.dead-letter", "a.dead-letter", true],
    ["a.b.dead-letter", "a.b.dead-letter", true],
  ];
  test.each(cases)("%p matches %p: %p", (pattern, channel, expected) => {
    expect(compilePattern(pattern)(channel)).toBe(expected);
  });
});

describe("subscriber names", () => {
  test.each(["s1", "thermostat.main", "a-b_c"])("accepts %p", (n) => expect(() => assertName(n)).not.toThrow());
  test.each(["", ".", "..", "a/b", "a~b", "a b", "x".repeat(129)])("rejects %p", (n) => {
    expect(() => assertName(n)).toThrow(InvalidNameError);
  });
});

describe("compileRules", () => {
  test("any pattern of the list allows; an empty list allows nothing; dead letters only by name", () => {
    const rules = compileRules(["telemetry.>", "cmd.*.ack", "plain"]);
    expect(["telemetry.a", "telemetry.a.b", "cmd.x.ack", "plain"].filter((c) => !rules(c))).toEqual([]);
    expect(["telemetry", "cmd.x.y", "cmd.ack", "plainer", "telemetry.a.dead-letter"].filter((c) => rules(c))).toEqual([]);
    expect(compileRules([])("anything")).toBe(false);
    expect(compileRules([">"])("a.b")).toBe(true);
    expect(() => compileRules(["bad..pattern"])).toThrow();
  });
});
