import { describe, expect, test } from "bun:test";
import { Packr, unpack } from "msgpackr";
import { decodeEnvelope, encodeEnvelope, toWire } from "../../src/envelope/envelope.ts";

const fields = {
  id: "01a22652-d86a-74a5-9d0e-2513d8bced1b",
  ts: 1795939293291,
  channel: "sensors.temp",
  origin: "dev1",
  type: "temp",
  correlationId: "c-1",
  serviceName: "sensor",
  route: ["dev1"],
  payload: { c: 21.5, raw: new Uint8Array([1, 2, 3]) },
};

describe("envelope codec", () => {
  test("round-trips every field and adds the header seq", () => {
    const msg = decodeEnvelope<typeof fields.payload>(encodeEnvelope(fields), 42);
    expect(msg).toMatchObject({ v: 1, seq: 42, id: fields.id, ts: fields.ts, channel: "sensors.temp", origin: "dev1", type: "temp" });
    expect(msg.correlationId).toBe("c-1");
    expect(msg.serviceName).toBe("sensor");
    expect(msg.route).toEqual(["dev1"]);
    expect(msg.payload.c).toBe(21.5);
    expect([...msg.payload.raw]).toEqual([1, 2, 3]);
  });

  test("stored body is a plain msgpack map with snake_case keys (readable by any decoder)", () => {
    const body = encodeEnvelope(fields);
    // The first byte is a fixmap or map16 header, not msgpackr's record extension.
    expect(body[0]! >> 4 === 0x8 || body[0] === 0xde).toBe(true);
    const plain = new Packr({ useRecords: false }).unpack(body) as Record<string, unknown>;
    expect(Object.keys(plain)).toEqual(["v", "id", "ts", "channel", "origin", "type", "correlation_id", "service_name", "route", "payload"]);
    expect(unpack(body)).toMatchObject({ correlation_id: "c-1", service_name: "sensor" });
  });

  test("optional fields are omitted, undefined payload becomes null", () => {
    const { correlationId: _c, serviceName: _s, ...rest } = fields;
    const msg = decodeEnvelope(encodeEnvelope({ ...rest, payload: undefined }), 1);
    expect("correlationId" in msg).toBe(false);
    expect("serviceName" in msg).toBe(false);
    expect(msg.payload).toBeNull();
  });

  test("undefined and functions inside a payload are stored as nil, not a private extension", () => {
    const body = encodeEnvelope({ ...fields, payload: { u: undefined, f: () => 1 } });
    expect(Buffer.from(body).includes(Buffer.from([0xd4, 0x00, 0x00]))).toBe(false);
    expect(decodeEnvelope(body, 1).payload).toEqual({ u: null, f: null });
  });

  test("toWire uses the JSON names of SPEC §2", () => {
    const wire = toWire(decodeEnvelope(encodeEnvelope(fields), 7));
    expect(Object.keys(wire)).toEqual(["v", "id", "seq", "ts", "channel", "origin", "type", "correlation_id", "service_name", "route", "payload"]);
  });

  test("bytes that are not an envelope are refused", () => {
    expect(() => decodeEnvelope(new Packr({ useRecords: false }).pack([1, 2]), 1)).toThrow("not an envelope");
  });
});
