import { describe, expect, test } from "bun:test";
import { channelToTopic, filterToPattern, topicToChannel } from "../../src/mqtt/topics.ts";
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

  test("what maps to no channel is refused with a typed error", () => {
    const codeOf = (f: () => unknown) => {
      try {
        f();
      } catch (err) {
        return (err as { code?: string }).code;
      }
      return "accepted";
    };
    const topics = ["a.b/c", "a//b", "/a", "a/+", "a/#", "$SYS/x"].map((t) => codeOf(() => topicToChannel(t)));
    expect(topics).toEqual(["invalid_argument", "invalid_channel", "invalid_channel", "invalid_argument", "invalid_argument", "invalid_channel"]);
    const filters = ["a/#/b", "a/b+", "a.b/#", "a//+"].map((f) => codeOf(() => filterToPattern(f)));
    expect(filters).toEqual(["invalid_argument", "invalid_argument", "invalid_argument", "invalid_pattern"]);
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
