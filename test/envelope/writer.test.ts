import { describe, expect, test } from "bun:test";
import { Packr } from "msgpackr";
import { decodeEnvelope, encodeEnvelope, encodeNewEnvelope, type EnvelopeFields, type MessageMeta } from "../../src/envelope/envelope.ts";
import { Utf8Bytes } from "../../src/envelope/utf8-bytes.ts";
import { EnvelopeWriter } from "../../src/envelope/writer.ts";

type EnvelopeBodyFields = EnvelopeFields & { v?: number };
import { rng } from "../helpers.ts";

// The encoder the log used before the writer, with the same options: the writer must give its bytes.
const packr = new Packr({ useRecords: false, moreTypes: false, int64AsType: "number", encodeUndefinedAsNil: true });
const writer = new EnvelopeWriter((v) => packr.pack(v));

/** The snake_case map of docs/storage.md, in its order: what msgpackr was given. */
function reference(f: EnvelopeBodyFields, v: number): Uint8Array {
  const m: Record<string, unknown> = { v, id: f.id, ts: f.ts, channel: f.channel, origin: f.origin, type: f.type };
  const opt: [keyof EnvelopeBodyFields, string][] = [
    ["correlationId", "correlation_id"],
    ["serviceName", "service_name"],
    ["expires", "expires"],
    ["contentType", "content_type"],
    ["replyTo", "reply_to"],
    ["correlationData", "correlation_data"],
    ["headers", "headers"],
    ["utf8", "utf8"],
    ["retain", "retain"],
    ["publisher", "publisher"],
    ["qos", "qos"],
  ];
  for (const [k, s] of opt) if (f[k] !== undefined) m[s] = f[k];
  m.route = f.route;
  m.payload = f.payload === undefined ? null : f.payload;
  return packr.pack(m);
}

function gen(r: () => number) {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
  // Lengths around every header boundary; characters of 1 to 4 UTF-8 bytes and lone surrogates.
  const lengths = [0, 1, 5, 30, 31, 32, 33, 62, 63, 64, 65, 84, 85, 86, 100, 254, 255, 256, 257, 1000, 21_845, 21_846, 30_000];
  const chars = ["a", "Z", "0", ".", "é", "ß", "€", "中", "\u{1F600}", "\uD800", "\uDC00", "\u007f", "\u0080", "\u07ff", "\u0800", "\uffff"];
  const str = (max = 300): string => {
    const n = Math.min(pick(lengths), max);
    const ascii = r() < 0.5;
    let s = "";
    while (s.length < n) s += ascii ? "x" : pick(chars);
    return s.slice(0, n);
  };
  const num = (): number =>
    pick([
      0,
      -0,
      1,
      31,
      127,
      128,
      255,
      256,
      65_535,
      65_536,
      2 ** 32 - 1,
      2 ** 32,
      -1,
      -32,
      -33,
      -128,
      -129,
      -32_768,
      -32_769,
      -(2 ** 31),
      -(2 ** 31) - 1,
      1.5,
      -2.25,
      Date.now(),
      2 ** 53 - 1,
      Number.NaN,
      Number.POSITIVE_INFINITY,
      Math.floor(r() * 2 ** 40),
      -Math.floor(r() * 2 ** 20),
      r() * 1000,
    ]);
  const bytes = (): Uint8Array => {
    const n = pick([0, 1, 200, 255, 256, 70_000 * (r() < 0.1 ? 1 : 0)]);
    const b = r() < 0.5 ? new Uint8Array(n) : Buffer.alloc(n);
    for (let i = 0; i < n; i++) b[i] = Math.floor(r() * 256);
    return b;
  };
  const payload = (): unknown =>
    pick([
      () => str(30_000),
      () => bytes(),
      () => null,
      () => undefined,
      () => ({ c: num(), s: str(100), list: [1, "two", null, true], nested: { b: bytes() } }),
      () => [str(40), num()],
      () => num(),
      () => r() < 0.5,
      () => new Uint16Array([1, 2, 3]),
    ])();
  const maybe = <T>(f: () => T): T | undefined => (r() < 0.3 ? f() : undefined);
  const f: EnvelopeBodyFields = {
    id: str(64),
    ts: num(),
    channel: str(300),
    origin: str(100),
    type: str(300),
    correlationId: maybe(() => str(300)),
    serviceName: maybe(() => str(300)),
    expires: maybe(num),
    contentType: maybe(() => str(1000)),
    replyTo: maybe(() => str(300)),
    correlationData: maybe(bytes),
    headers: maybe(() => Array.from({ length: pick([0, 1, 3, 15, 16, 17]) }, () => [str(100), str(300)] as [string, string])),
    utf8: maybe(() => true),
    retain: maybe(() => r() < 0.5),
    publisher: maybe(() => str(100)),
    qos: maybe(() => pick([0, 1, 2])),
    route: Array.from({ length: pick([0, 1, 2, 15, 16, 17]) }, () => str(64)),
    payload: payload(),
  };
  return f;
}

describe("envelope writer", () => {
  test("writes msgpackr's bytes for 5,000 random envelopes (strings, numbers, bytes and payloads at every header boundary)", () => {
    const r = rng(19);
    let written = 0;
    for (let i = 0; i < 5000; i++) {
      const f = gen(r);
      const v = i % 3 === 0 ? 1 : i % 3 === 1 ? 300 : 70_000;
      const mine = writer.write(f, v);
      const want = reference(f, v);
      if (mine === null) continue; // too large for the scratch buffer: msgpackr writes it
      written++;
      if (Buffer.compare(Buffer.from(mine), Buffer.from(want)) !== 0) throw new Error(`envelope ${i} differs: ${JSON.stringify(f).slice(0, 300)}`);
    }
    // Most of them go the fast way; the ones left to msgpackr are the large ones.
    expect(written).toBeGreaterThan(4000);
  });

  test("a text payload given as its UTF-8 bytes is written as the same str its string gets (5,000 random envelopes)", () => {
    const r = rng(23);
    const encoder = new TextEncoder();
    let compared = 0;
    for (let i = 0; i < 5000; i++) {
      const f = gen(r);
      if (typeof f.payload !== "string") continue;
      // The bytes a string encodes to (a lone surrogate as U+FFFD, as the writer writes it), in a view
      // of a larger buffer as a socket's read would hold them.
      const b = encoder.encode(f.payload);
      const wire = new Uint8Array(b.length + 10);
      wire.set(b, 7);
      // (Bytes are sized exactly where a string is sized at 3 bytes a unit: some fit only as bytes.)
      const mine = writer.write({ ...f, payload: new Utf8Bytes(wire.subarray(7, 7 + b.length)) }, 1);
      if (mine === null) continue;
      const want = writer.write(f, 1) ?? reference(f, 1);
      compared++;
      if (Buffer.compare(Buffer.from(mine!), Buffer.from(want)) !== 0) throw new Error(`envelope ${i} differs: ${JSON.stringify(f).slice(0, 300)}`);
    }
    expect(compared).toBeGreaterThan(500);
  });

  test("a text payload as bytes too large for the writer goes to msgpackr as its string, and reads back as that string", () => {
    const text = "é".repeat(20_000);
    const f = { id: "i", ts: 1, channel: "c", origin: "o", type: "t", route: ["o"], payload: new Utf8Bytes(Buffer.from(text)) };
    expect(writer.write(f, 1)).toBeNull();
    const body = encodeEnvelope(f);
    expect(Buffer.from(body).equals(Buffer.from(reference({ ...f, payload: text }, 1)))).toBe(true);
    expect(decodeEnvelope(body, 1).payload).toBe(text);
  });

  test("metadata given apart from the other fields is written as if it were among them (2,000 random envelopes)", () => {
    const r = rng(29);
    const metaKeys = ["expires", "contentType", "replyTo", "correlationData", "headers", "utf8", "retain", "publisher", "qos"] as const;
    let withMeta = 0;
    for (let i = 0; i < 2000; i++) {
      const f = gen(r);
      const rest: Record<string, unknown> = { ...f };
      const meta: Record<string, unknown> = {};
      for (const k of metaKeys) {
        if (f[k] !== undefined) meta[k] = f[k];
        delete rest[k];
      }
      if (Object.keys(meta).length > 0) withMeta++;
      const apart = writer.write(rest, 1, meta);
      const together = writer.write(f, 1);
      expect(apart === null).toBe(together === null);
      if (apart && together && Buffer.compare(Buffer.from(apart), Buffer.from(together)) !== 0) throw new Error(`envelope ${i} differs`);
      // The general way (msgpackr) too, for what the writer leaves to it.
      if (!apart && Buffer.compare(Buffer.from(encodeEnvelope(rest as unknown as EnvelopeBodyFields, meta)), Buffer.from(encodeEnvelope(f))) !== 0) throw new Error(`envelope ${i} differs`);
    }
    expect(withMeta).toBeGreaterThan(1000);
  });

  test("a new message written from its fields one by one has the bytes of its fields' object with route [origin] (2,000 random envelopes)", () => {
    const r = rng(31);
    const metaKeys = ["expires", "contentType", "replyTo", "correlationData", "headers", "utf8", "retain", "publisher", "qos"] as const;
    let written = 0;
    let general = 0;
    for (let i = 0; i < 2000; i++) {
      const f = gen(r);
      f.route = [f.origin];
      const meta: Record<string, unknown> = {};
      for (const k of metaKeys) if (f[k] !== undefined) meta[k] = f[k];
      const hasMeta = Object.keys(meta).length > 0 ? meta : undefined;
      const fresh = writer.writeNew(1, f.id, f.ts, f.channel, f.origin, f.type, f.correlationId, f.serviceName, hasMeta, f.payload);
      const whole = writer.write(f, 1);
      expect(fresh === null).toBe(whole === null);
      if (fresh && whole && Buffer.compare(Buffer.from(fresh), Buffer.from(whole)) !== 0) throw new Error(`envelope ${i} differs`);
      if (fresh) written++;
      // And the exported way, which leaves what the writer refuses to msgpackr: the same bytes as encodeEnvelope.
      let a: Uint8Array | Error;
      let b: Uint8Array | Error;
      try {
        a = encodeNewEnvelope(f.id, f.ts, f.channel, f.origin, f.type, f.correlationId, f.serviceName, hasMeta as MessageMeta | undefined, f.payload);
      } catch (err) {
        a = err as Error;
      }
      try {
        b = encodeEnvelope({ ...f, v: undefined } as EnvelopeBodyFields);
      } catch (err) {
        b = err as Error;
      }
      if (a instanceof Error || b instanceof Error) expect(String(a)).toBe(String(b));
      else if (Buffer.compare(Buffer.from(a), Buffer.from(b)) !== 0) throw new Error(`envelope ${i} differs the general way`);
      if (!fresh) general++;
    }
    expect(written).toBeGreaterThan(1000);
    expect(general).toBeGreaterThan(10);
  });

  test("a body is a copy of its own: the next write does not change it", () => {
    const f = gen(rng(7));
    f.payload = "first";
    const a = writer.write(f, 1)!;
    const before = Buffer.from(a).toString("hex");
    f.payload = "second, and longer";
    writer.write(f, 1);
    expect(Buffer.from(a).toString("hex")).toBe(before);
    expect(a.byteLength).toBe(a.buffer.byteLength);
  });

  test("refuses what it does not write, and encodeEnvelope falls back to msgpackr with the same bytes", () => {
    const base = { id: "i", ts: 1, channel: "c", origin: "o", type: "t", route: ["o"], payload: "p" };
    // Not strings where strings go; a payload past the scratch buffer's half.
    expect(writer.write({ ...base, id: 5 as unknown as string }, 1)).toBeNull();
    expect(writer.write({ ...base, route: [7 as unknown as string] }, 1)).toBeNull();
    expect(writer.write({ ...base, headers: [["a", 1 as unknown as string]] }, 1)).toBeNull();
    expect(writer.write({ ...base, payload: "x".repeat(20_000) }, 1)).toBeNull();
    const big = { ...base, payload: "x".repeat(20_000) };
    expect(Buffer.from(encodeEnvelope(big)).equals(Buffer.from(reference(big, 1)))).toBe(true);
    expect(decodeEnvelope(encodeEnvelope(big), 1).payload).toBe(big.payload);
  });
});
