import { describe, expect, test } from "bun:test";
import { channelToTopic, filterToPattern, filterToPatterns, hiddenFromWildcard, topicToChannel } from "../../src/mqtt/topics.ts";
import { pubackBytes } from "../../src/mqtt/payload.ts";
import mqtt from "mqtt-packet";

describe("MQTT topics and keyop channels", () => {
  test("topic names map level for level, and back", () => {
    expect(topicToChannel("sensors/kitchen/temp")).toBe("sensors.kitchen.temp");
    expect(channelToTopic("sensors.kitchen.temp")).toBe("sensors/kitchen/temp");
  });

  test("filters map + to * and a last # to >", () => {
    expect(filterToPattern("sensors/+/temp")).toBe("sensors.*.temp");
    expect(filterToPattern("sensors/#")).toBe("sensors.>");
  });

  test("every level a broker must take has a channel, and comes back unchanged", () => {
    const topics = ["/TopicA", "a//b", "a/b/", "/", "//", "a.b/c", "client_test5//TopicA", "$foo/bar", "dev 1/temp", "capteur/é/温度", "--x/y", "a/dead-letter", "dead-letter/a", "a/--"];
    const channels = topics.map(topicToChannel);
    expect(new Set(channels).size).toBe(topics.length);
    for (const [i, c] of channels.entries()) expect(channelToTopic(c)).toBe(topics[i]!);
    expect(topicToChannel("/TopicA")).toBe("--.TopicA");
    expect(topicToChannel("a//b")).toBe("a.--.b");
    expect(topicToChannel("a.b/c")).toBe("--612e62.c");
    // A last level "dead-letter" is not keyop's dead-letter channel of "a".
    expect(topicToChannel("a/dead-letter")).not.toBe("a.dead-letter");
    expect(topicToChannel("dead-letter/a")).toBe("dead-letter.a");
  });

  test("round trip over random topics: injective and reversible", () => {
    let seed = 11;
    const rnd = (n: number) => (seed = (seed * 1_103_515_245 + 12_345) & 0x7fffffff) % n;
    const alphabet = ["a", "B", "7", "_", "-", ".", " ", "$", "é", "/", "/", "--", "dead-letter"];
    const seen = new Map<string, string>();
    for (let k = 0; k < 3000; k++) {
      let t = "";
      for (let j = 1 + rnd(8); j > 0; j--) t += alphabet[rnd(alphabet.length)];
      if (t.startsWith("$SYS")) continue;
      const c = topicToChannel(t);
      expect(channelToTopic(c)).toBe(t);
      const other = seen.get(c);
      if (other !== undefined) expect(other).toBe(t);
      seen.set(c, t);
    }
  });

  test("filters map level by level too, with + and #; a filter starting with a wildcard does not get $ topics", () => {
    expect(filterToPattern("/+/x")).toBe("--.*.x");
    expect(filterToPattern("a//#")).toBe("a.--.>");
    expect(filterToPattern("client_test5//TopicA")).toBe(topicToChannel("client_test5//TopicA"));
    const dollar = topicToChannel("$foo/bar");
    expect(hiddenFromWildcard(filterToPattern("#"), dollar)).toBe(true);
    expect(hiddenFromWildcard(filterToPattern("+/bar"), dollar)).toBe(true);
    expect(hiddenFromWildcard(filterToPattern("$foo/#"), dollar)).toBe(false);
    expect(hiddenFromWildcard(filterToPattern("#"), topicToChannel("foo/bar"))).toBe(false);
    // One level only, and a pattern whose first token only starts like a wildcard's.
    expect(hiddenFromWildcard(filterToPattern("#"), topicToChannel("$"))).toBe(true);
    expect(hiddenFromWildcard(filterToPattern("+"), topicToChannel("$x"))).toBe(true);
    expect(hiddenFromWildcard("*x.bar", dollar)).toBe(false);
    expect(hiddenFromWildcard(filterToPattern("#"), topicToChannel("--24/x"))).toBe(false);
  });

  test("a filter ending in /# also subscribes to its parent level, as MQTT's # matches it", () => {
    expect(filterToPatterns("sport/#")).toEqual(["sport.>", "sport"]);
    expect(filterToPatterns("+/#")).toEqual(["*.>", "*"]);
    expect(filterToPatterns("#")).toEqual([">"]);
    expect(filterToPatterns("/#")).toEqual(["--.>"]);
    expect(filterToPatterns("a/dead-letter/#")).toEqual(["a.dead-letter.>", topicToChannel("a/dead-letter")]);
    expect(filterToPatterns("sport/tennis")).toEqual(["sport.tennis"]);
  });

  test("what maps to no channel is refused with a typed error", () => {
    const codeOf = (f: () => unknown) => {
      try {
        f();
      } catch (err) {
        return (err as { code?: string }).code;
      }
      return "accepted";
    };
    const topics = ["a/+", "a/#", "$SYS/x", "", "a\u0000b", "x/".repeat(200)].map((t) => codeOf(() => topicToChannel(t)));
    expect(topics).toEqual(["invalid_argument", "invalid_argument", "invalid_argument", "invalid_argument", "invalid_argument", "invalid_channel"]);
    const filters = ["a/#/b", "a/b+", ""].map((f) => codeOf(() => filterToPattern(f)));
    expect(filters).toEqual(["invalid_argument", "invalid_argument", "invalid_argument"]);
  });
});

describe("hand-written PUBACK", () => {
  test("is the packet mqtt-packet writes, in 3.1.1 and 5.0, and parses back in both", () => {
    for (const id of [1, 255, 256, 4660, 65_535]) {
      expect([...pubackBytes(id)]).toEqual([...mqtt.generate({ cmd: "puback", messageId: id } as mqtt.Packet)]);
      for (const protocolVersion of [4, 5]) {
        const parser = mqtt.parser({ protocolVersion });
        let got: mqtt.Packet | undefined;
        parser.on("packet", (p) => (got = p));
        parser.parse(Buffer.from(pubackBytes(id)));
        expect(got).toMatchObject({ cmd: "puback", messageId: id });
      }
    }
  });
});
