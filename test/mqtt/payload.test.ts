import { describe, expect, test } from "bun:test";
import { decodeEnvelope, encodeEnvelope } from "../../src/envelope/envelope.ts";
import { Utf8Bytes } from "../../src/envelope/utf8-bytes.ts";
import { payloadOf } from "../../src/mqtt/payload.ts";

const stored = (payload: unknown) => decodeEnvelope(encodeEnvelope({ id: "i", ts: 1, channel: "c", origin: "o", type: "t", route: ["o"], payload }), 1).payload;

describe("payloadOf", () => {
  test("valid UTF-8 is text: kept as its bytes, stored and read back as the string", () => {
    for (const text of ["", "plain", '{"t":1,"pad":"xxxx"}', "é€中\u{1F600}", "x".repeat(70_000)]) {
      const bytes = Buffer.from(text);
      const p = payloadOf(bytes);
      expect(p).toBeInstanceOf(Utf8Bytes);
      expect((p as Utf8Bytes).bytes).toBe(bytes);
      expect(String(p)).toBe(text);
      expect(stored(p)).toBe(text);
    }
  });

  test("anything that is not UTF-8 is bytes, copied out of the read's buffer", () => {
    const bad = [[0xff], [0xc3], [0xe2, 0x82], [0xc0, 0x80], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80], [0x61, 0x80, 0x62]];
    for (const b of bad) {
      const wire = Buffer.from([0x20, ...b, 0x20]);
      const view = wire.subarray(1, 1 + b.length);
      const p = payloadOf(view);
      expect(p).not.toBeInstanceOf(Utf8Bytes);
      expect([...(p as Uint8Array)]).toEqual(b);
      wire.fill(0);
      expect([...(p as Uint8Array)]).toEqual(b);
      expect([...(stored(p) as Uint8Array)]).toEqual(b);
    }
  });
});
