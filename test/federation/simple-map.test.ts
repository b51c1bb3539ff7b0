import { describe, expect, test } from "bun:test";
import { Packr } from "msgpackr";
import { HEADER_BYTES } from "../../src/federation/frame.ts";
import { ackFrame, batchFrame, pingFrame } from "../../src/federation/messages.ts";
import { readSimpleMap } from "../../src/federation/simple-map.ts";
import { rng } from "../helpers.ts";

// The general decoder as frame.ts configures it: the fast path must give what it gives.
const packr = new Packr({ useRecords: false, moreTypes: false, mapsAsObjects: true, int64AsType: "number", encodeUndefinedAsNil: true });

/** A random value: the kinds the fast path takes, and (when `wild`) some it leaves to msgpackr. */
function randomValue(r: () => number, wild: boolean, depth = 0): unknown {
  const kinds = wild ? 12 : 8;
  switch (Math.floor(r() * kinds)) {
    case 0:
      return Math.floor(r() * 128);
    case 1:
      return Math.floor(r() * 2 ** [8, 16, 32, 48][Math.floor(r() * 4)]!);
    case 2:
      return "k".repeat(Math.floor(r() * 300)) + String(Math.floor(r() * 1000));
    case 3:
      return r() < 0.5;
    case 4:
      return null;
    case 5:
      return new Uint8Array(Math.floor(r() * 70_000 * (r() < 0.1 ? 1 : 0.01))).map((_, i) => i & 0xff);
    case 6:
      return Date.now() + Math.floor(r() * 1000);
    case 7:
      return depth > 0 ? 1 : Array.from({ length: Math.floor(r() * 20) }, () => randomValue(r, wild, depth + 1));
    case 8:
      return -Math.floor(r() * 1000) - 1;
    case 9:
      return "é" + "x".repeat(Math.floor(r() * 5));
    case 10:
      return { nested: 1 };
    default:
      return 1.5;
  }
}

function randomBody(r: () => number, wild: boolean): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  const keys = Math.floor(r() * 20);
  for (let i = 0; i < keys; i++) body[`f${Math.floor(r() * 30)}`] = randomValue(r, wild);
  return body;
}

describe("readSimpleMap: the fast path for frame bodies", () => {
  test("whatever it returns is what msgpackr returns, and it takes every body of the kinds it knows", () => {
    const r = rng(19);
    let fast = 0;
    let total = 0;
    for (let i = 0; i < 3000; i++) {
      const wild = i % 2 === 1;
      const bytes = packr.pack(randomBody(r, wild));
      const got = readSimpleMap(bytes);
      total++;
      if (got === null) {
        // Only a body with a kind it does not know may be left to the general decoder.
        expect(wild).toBe(true);
        continue;
      }
      fast++;
      expect(got).toEqual(packr.unpack(bytes));
    }
    expect(fast).toBeGreaterThan(total / 2);
  });

  test("the frames of the message path take it: BATCH, ACK, PING", () => {
    const records = [new Uint8Array([0x80]), new Uint8Array(300).fill(7), new Uint8Array(70_000).fill(1)];
    for (const frame of [
      batchFrame({ batch: 70_000, channel: "up.sensor-1.temp", seqs: [1, 300, 2 ** 40], records, delayAck: true }),
      ackFrame({ batch: 12, channel: "up.x", upto: 99_999 }),
      pingFrame({ t: Date.now() }),
      pingFrame({ t: Date.now(), r: 3.25 }),
    ]) {
      const body = frame.subarray(HEADER_BYTES);
      const got = readSimpleMap(body);
      expect(got).not.toBeNull();
      expect(got).toEqual(packr.unpack(body));
    }
  });

  test("binaries are views of the bytes, as msgpackr's are (no copy)", () => {
    const bytes = packr.pack({ r: [new Uint8Array([1, 2, 3])] });
    const got = readSimpleMap(bytes) as { r: Uint8Array[] };
    expect(got.r[0]!.buffer).toBe(bytes.buffer);
    expect([...got.r[0]!]).toEqual([1, 2, 3]);
  });

  test("truncated, trailing, non-map and hostile bytes give null, never a throw", () => {
    const good = packr.pack({ n: 1, c: "up.x", s: [1, 2], r: [new Uint8Array(40)] });
    for (let cut = 0; cut < good.length; cut++) expect(readSimpleMap(good.subarray(0, cut))).toBeNull();
    const trailing = new Uint8Array(good.length + 1);
    trailing.set(good);
    expect(readSimpleMap(trailing)).toBeNull();
    expect(readSimpleMap(packr.pack([1, 2]))).toBeNull();
    expect(readSimpleMap(packr.pack("text"))).toBeNull();
    // A key that would set the prototype, a non-string key, a count far past the bytes.
    expect(readSimpleMap(new Uint8Array([0x81, 0xa9, ...new TextEncoder().encode("__proto__"), 0x01]))).toBeNull();
    expect(readSimpleMap(new Uint8Array([0x81, 0x01, 0x01]))).toBeNull();
    expect(readSimpleMap(new Uint8Array([0x81, 0xa1, 0x73, 0xdd, 0xff, 0xff, 0xff, 0xff]))).toBeNull();
    expect(readSimpleMap(new Uint8Array([0xc1]))).toBeNull();
    // Random bytes: null or msgpackr's own answer.
    const r = rng(7);
    for (let i = 0; i < 2000; i++) {
      const junk = new Uint8Array(Math.floor(r() * 40)).map(() => Math.floor(r() * 256));
      junk[0] = 0x80 | Math.floor(r() * 4);
      const got = readSimpleMap(junk);
      if (got !== null) expect(got).toEqual(packr.unpack(junk));
    }
  });
});
