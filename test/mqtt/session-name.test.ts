import { describe, expect, test } from "bun:test";
import { assertName } from "../../src/envelope/names.ts";
import { sessionName } from "../../src/mqtt/session.ts";

describe("sessionName: MQTT client id to durable subscriber name", () => {
  test("the ids keyop always took keep their readable names, so existing sessions are found again", () => {
    expect(sessionName("sensor-1")).toBe("mqtt.sensor-1");
    expect(sessionName("a.b_c-D")).toBe("mqtt.a.b_c-D");
  });
  test("any other id gets a valid name of its own form; different ids never share one", () => {
    const ids = [
      "aa:bb:cc:dd:ee:ff",
      "device/42",
      "clean retained",
      "",
      " ",
      "é",
      "温度",
      "a/b",
      "a_b",
      "mqtt-x.61",
      "x".repeat(101),
      "x".repeat(56),
      "ü".repeat(28),
      "ü".repeat(29),
      "y".repeat(5000),
    ];
    const names = ids.map(sessionName);
    expect(new Set(names).size).toBe(ids.length);
    for (const n of names) {
      expect(() => assertName(n, "subscriber name")).not.toThrow();
      expect(new TextEncoder().encode(n).length).toBeLessThanOrEqual(128);
    }
    expect(sessionName("device/42")).toBe(`mqtt-x.${Buffer.from("device/42").toString("hex")}`);
    expect(sessionName("y".repeat(5000))).toMatch(/^mqtt-h\.[0-9a-f]{64}$/);
  });
});
