import { describe, expect, test } from "bun:test";
import { freePort } from "./ports.ts";

describe("freePort", () => {
  test("never hands out one port twice in a process, and each can be bound", () => {
    const got = Array.from({ length: 300 }, () => freePort());
    expect(new Set(got).size).toBe(got.length);
    for (const p of got.slice(-3)) {
      const l = Bun.listen({ hostname: "127.0.0.1", port: p, socket: { data() {} } });
      expect(l.port).toBe(p);
      l.stop(true);
    }
  });
});
