import { describe, expect, test } from "bun:test";
import { Packr } from "msgpackr";
import { decodeEnvelope, encodeEnvelope, type EnvelopeFields } from "../../src/envelope/envelope.ts";
import { channelIs, envelopeChannel, envelopeId, publisherIs, routeEntry, routeIncludes, routeNames, scanEnvelope, utf8Bytes, withRoute } from "../../src/envelope/scan.ts";
import { storedPayload } from "../../src/mqtt/payload.ts";

/** What the scan gives, decoded. */
function read(body: Uint8Array): { id: string; channel: string; route: string[] } {
  const v = scanEnvelope(body);
  return { id: envelopeId(body, v), channel: envelopeChannel(body, v), route: routeNames(body, v) };
}
import { InvalidArgumentError } from "../../src/errors.ts";

const plain = new Packr({ useRecords: false, moreTypes: false, encodeUndefinedAsNil: true });

function fields(over: Partial<EnvelopeFields> = {}): EnvelopeFields {
  return { id: "0190a0b0-0000-7000-8000-000000000001", ts: 1_764_000_000_000, channel: "sensors.temp", origin: "dev-a", type: "reading", route: ["dev-a"], payload: { c: 21.5 }, ...over };
}

const payloads: unknown[] = [
  null,
  true,
  -1,
  127,
  128,
  -33,
  65_536,
  2 ** 40,
  -(2 ** 40),
  1.5,
  "",
  "x".repeat(31),
  "x".repeat(32),
  "é".repeat(200),
  "y".repeat(70_000),
  new Uint8Array([0, 1, 2, 255]),
  new Uint8Array(300),
  [],
  [1, [2, [3, { a: [4] }]]],
  Array.from({ length: 20 }, (_, i) => i),
  { nested: { deeper: { list: [null, false, "s"] } }, n: 3 },
  Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`k${i}`, i])),
];

/** A map of `n` entries: id, channel, an empty route, then `key` (default "p") holding the bytes `value` (or "d"). */
function raw(n: number, value: number[], key = "p"): Uint8Array {
  const v = value.length > 0 ? value : [...plain.pack("d")];
  return new Uint8Array([0x80 | n, ...plain.pack("id"), ...plain.pack("a"), ...plain.pack("channel"), ...plain.pack("c"), ...plain.pack("route"), 0x90, ...plain.pack(key), ...v]);
}

describe("scanEnvelope", () => {
  test("reads id, channel and route like the full decoder, for payloads of every msgpack shape", () => {
    for (const payload of payloads) {
      for (const extra of [{}, { correlationId: "corr-1", serviceName: "svc" }]) {
        const body = encodeEnvelope(fields({ payload, ...extra }));
        const full = decodeEnvelope(body, 1);
        expect(read(body)).toEqual({ id: full.id, channel: full.channel, route: full.route });
      }
    }
  });

  test("withRoute appends a name and keeps every other field byte for byte", () => {
    for (const n of [0, 1, 14, 15, 16, 40]) {
      const route = Array.from({ length: n }, (_, i) => `hop-${i}`);
      for (const name of ["hub", "n".repeat(31), "n".repeat(32), "ünïcode"]) {
        const src = fields({ route, payload: { deep: [1, "two", new Uint8Array([3])] }, correlationId: "c" });
        const body = encodeEnvelope(src);
        const out = withRoute(body, scanEnvelope(body), routeEntry(name));
        const before = decodeEnvelope(body, 7);
        const after = decodeEnvelope(out, 7);
        expect(after.route).toEqual([...route, name]);
        expect({ ...after, route: [] }).toEqual({ ...before, route: [] });
        // The amended body is itself a valid envelope with the same view.
        expect(read(out).route).toEqual([...route, name]);
        // Same bytes as a full re-encode: the spliced form is canonical.
        expect([...out]).toEqual([...encodeEnvelope({ ...src, route: [...route, name] })]);
      }
    }
  });

  test("route and channel checks compare content, whatever string form a peer wrote", () => {
    // "hub" as str8 (0xd9 0x03 ...) instead of the minimal fixstr: still the name "hub".
    const body = new Uint8Array([
      0x84,
      ...plain.pack("id"),
      ...plain.pack("a"),
      ...plain.pack("channel"),
      0xd9,
      0x01,
      0x63,
      ...plain.pack("route"),
      0x92,
      ...plain.pack("dev"),
      0xd9,
      0x03,
      0x68,
      0x75,
      0x62,
      ...plain.pack("p"),
      0xc0,
    ]);
    const v = scanEnvelope(body);
    expect(routeIncludes(body, v, utf8Bytes("hub"))).toBe(true);
    expect(routeIncludes(body, v, utf8Bytes("hu"))).toBe(false);
    expect(routeIncludes(body, v, utf8Bytes("hubs"))).toBe(false);
    expect(channelIs(body, v, utf8Bytes("c"))).toBe(true);
    expect(channelIs(body, v, utf8Bytes("cc"))).toBe(false);
    expect(routeNames(body, v)).toEqual(["dev", "hub"]);
    expect(decodeEnvelope(withRoute(body, v, routeEntry("b")), 1).route).toEqual(["dev", "hub", "b"]);
  });

  test("finds the payload's bytes, the publisher and the QoS, and says whether other metadata is there", () => {
    for (const payload of payloads) {
      const body = encodeEnvelope(fields({ payload }));
      const v = scanEnvelope(body);
      expect(plain.unpack(body.subarray(v.payloadStart, v.payloadEnd))).toEqual(payload);
      expect([v.hasMeta, v.publisherStart, v.qos]).toEqual([false, -1, -1]);
      // Text and bytes are cut out as they are stored; anything else is JSON.
      const mqtt = new TextDecoder().decode(storedPayload(body, v));
      expect(mqtt).toBe(typeof payload === "string" ? payload : payload instanceof Uint8Array ? new TextDecoder().decode(payload) : JSON.stringify(payload ?? null));
    }
    const withMeta = encodeEnvelope(fields({ publisher: "dev/7", qos: 2 }));
    const v = scanEnvelope(withMeta);
    expect([v.hasMeta, v.qos, publisherIs(withMeta, v, utf8Bytes("dev/7")), publisherIs(withMeta, v, utf8Bytes("dev/8"))]).toEqual([false, 2, true, false]);
    expect(scanEnvelope(encodeEnvelope(fields({ headers: [["a", "1"]] }))).hasMeta).toBe(true);
    expect(decodeEnvelope(encodeEnvelope(fields({ headers: [["a", "1"]], expires: 5, utf8: true })), 1)).toMatchObject({ headers: [["a", "1"]], expires: 5, utf8: true });
  });

  test("a publisher or qos of another type is skipped like an unknown key, not refused", () => {
    const odd = raw(4, [...plain.pack("nine")], "qos");
    expect(scanEnvelope(odd).qos).toBe(-1);
    const odd2 = raw(4, [...plain.pack(7)], "publisher");
    expect(scanEnvelope(odd2).publisherStart).toBe(-1);
    expect(decodeEnvelope(odd, 1).qos).toBeUndefined();
  });

  test("refuses bodies that are not envelopes, with a typed error", () => {
    const good = encodeEnvelope(fields());
    const cases: [string, Uint8Array][] = [
      ["empty", new Uint8Array(0)],
      ["not a map", plain.pack([1, 2])],
      ["trailing bytes", new Uint8Array([...good, 0x01])],
      ["no route", plain.pack({ id: "a", channel: "c", payload: 1 })],
      ["route not a list", plain.pack({ id: "a", channel: "c", route: "x" })],
      ["route entry not a string", plain.pack({ id: "a", channel: "c", route: [1] })],
      ["id not a string", plain.pack({ id: 5, channel: "c", route: [] })],
      ["key not a string", new Uint8Array([0x81, 0x01, 0x02])],
      ["reserved byte 0xc1", raw(4, [0xc1])],
      ["unknown extension", raw(4, [0xd4, 0x05, 0x00])],
      ["nested too deeply", plain.pack({ id: "a", channel: "c", route: [], payload: JSON.parse("[".repeat(100) + "]".repeat(100)) })],
      ["array count larger than the body", raw(4, [0xdd, 0x7f, 0xff, 0xff, 0xff])],
      ["a key twice", raw(4, [], "channel")],
    ];
    for (const [what, body] of cases) {
      let err: unknown;
      try {
        scanEnvelope(body);
      } catch (e) {
        err = e;
      }
      expect({ what, code: (err as InvalidArgumentError | undefined)?.code }).toEqual({ what, code: "invalid_argument" });
    }
  });

  test("every truncation of a valid body is refused", () => {
    const body = encodeEnvelope(fields({ payload: { list: [1, 2, 3], s: "text", b: new Uint8Array(10) }, correlationId: "c" }));
    for (let cut = 0; cut < body.length; cut++) expect(() => scanEnvelope(body.subarray(0, cut))).toThrow(InvalidArgumentError);
  });

  test("fuzz: mutated bodies are either refused or read exactly as the full decoder reads them", () => {
    let seed = 42;
    const rnd = () => (seed = (seed * 1_103_515_245 + 12_345) & 0x7fffffff) / 0x7fffffff;
    const bases = payloads.slice(0, 14).map((payload) => encodeEnvelope(fields({ payload })));
    let accepted = 0;
    for (let i = 0; i < 20_000; i++) {
      const base = bases[i % bases.length]!;
      const body = new Uint8Array(base); // a copy (Buffer#slice would share the bytes)
      const flips = 1 + Math.floor(rnd() * 3);
      for (let k = 0; k < flips; k++) body[Math.floor(rnd() * body.length)] = Math.floor(rnd() * 256);
      let view: ReturnType<typeof scanEnvelope>;
      try {
        view = scanEnvelope(body);
        routeNames(body, view);
      } catch (e) {
        expect(e).toBeInstanceOf(InvalidArgumentError);
        continue;
      }
      accepted++;
      const full = decodeEnvelope(body, 1);
      expect(read(body)).toEqual({ id: full.id, channel: full.channel, route: full.route });
      expect(routeIncludes(body, view, utf8Bytes("dev-a"))).toBe(full.route.includes("dev-a"));
      expect(decodeEnvelope(withRoute(body, view, routeEntry("hub")), 1).route).toEqual([...full.route, "hub"]);
    }
    // Mutations inside the payload keep a body valid: the fuzz exercised both outcomes.
    expect(accepted).toBeGreaterThan(100);
  });
});
