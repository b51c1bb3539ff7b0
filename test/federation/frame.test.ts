import { describe, expect, test } from "bun:test";
import { CopyBlocks } from "../../src/bytes.ts";
import { encodeFrame, FrameDecoder, FrameError, FrameType, HEADER_BYTES, type Frame } from "../../src/federation/frame.ts";
import {
  ackFrame,
  batchFrame,
  batchFrameOf,
  closeFrame,
  helloFrame,
  parseAck,
  parseBatch,
  parseClose,
  parseHello,
  parsePing,
  parseWelcome,
  pingFrame,
  pongFrame,
  welcomeFrame,
} from "../../src/federation/messages.ts";

const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");
const unhex = (h: string) => new Uint8Array(Buffer.from(h, "hex"));
const one2 = (bytes: Uint8Array): Frame => {
  const f = new FrameDecoder(64 << 20).push(bytes);
  expect(f.length).toBe(1);
  return f[0]!;
};
const one = (bytes: Uint8Array): Frame => {
  const f = new FrameDecoder(1 << 20).push(bytes);
  expect(f.length).toBe(1);
  return f[0]!;
};

const hello = { versions: [1], name: "dev1", mode: "link" as const, publish: ["t.>"], subscribe: ["cmd.dev1"], heartbeatMs: 10000, maxBatchBytes: 1048576 };
const welcome = { version: 1, name: "hub", publish: ["t.>"], subscribe: [], heartbeatMs: 10000, maxBatchBytes: 1048576 };
const batch = { batch: 1, channel: "t.a", seqs: [7, 8], records: [new Uint8Array([0x81, 0xa1, 0x76, 0x01]), new Uint8Array([0xc0])] };

/** Golden vectors: the bytes on the wire must never change by accident (docs/protocol.md). */
const GOLDEN: [string, Uint8Array, string][] = [
  ["HELLO", helloFrame(hello), "4b59010100000041de0007a1769101a46e616d65a464657631a46d6f6465a46c696e6ba370756291a3742e3ea373756291a8636d642e64657631a26862cd2710a36d6262ce00100000"],
  ["WELCOME", welcomeFrame(welcome), "4b5901020000002cde0006a17601a46e616d65a3687562a370756291a3742e3ea373756290a26862cd2710a36d6262ce00100000"],
  ["BATCH", batchFrame(batch), "4b5901030000001dde0004a16e01a163a3742e61a173920708a17292c40481a17601c401c0"],
  ["ACK", ackFrame({ batch: 1, channel: "t.a", upto: 8 }), "4b5901040000000fde0003a16e01a163a3742e61a17508"],
  ["PING", pingFrame({ t: 1 }), "4b59010500000006de0001a17401"],
  ["PONG", pongFrame({ t: 1 }), "4b59010600000006de0001a17401"],
  ["CLOSE", closeFrame({ code: "bye", reason: "shutdown" }), "4b5901070000001cde0002a4636f6465a3627965a6726561736f6ea873687574646f776e"],
];

describe("frame codec", () => {
  test.each(GOLDEN)("golden bytes of %s", (_name, bytes, expected) => {
    expect(hex(bytes)).toBe(expected);
  });

  test("golden bytes decode back to the same messages", () => {
    expect(parseHello(one(unhex(GOLDEN[0]![2])))).toEqual(hello);
    expect(parseWelcome(one(unhex(GOLDEN[1]![2])))).toEqual(welcome);
    const b = parseBatch(one(unhex(GOLDEN[2]![2])));
    expect({ ...b, records: b.records.map((r) => [...r]) }).toEqual({ ...batch, records: batch.records.map((r) => [...r]) });
    expect(parseAck(one(unhex(GOLDEN[3]![2])))).toEqual({ batch: 1, channel: "t.a", upto: 8 });
    expect(parsePing(one(unhex(GOLDEN[4]![2])))).toEqual({ t: 1 });
    expect(parseClose(one(unhex(GOLDEN[6]![2])))).toEqual({ code: "bye", reason: "shutdown" });
  });

  test("a PING may carry the round trip its sender measured; a PONG echoes the time only; a bad one is refused", () => {
    expect(parsePing(one(pingFrame({ t: 5, r: 12.5 })))).toEqual({ t: 5, r: 12.5 });
    expect(parsePing(one(pingFrame({ t: 5 })))).toEqual({ t: 5 });
    expect(parsePing(one(pongFrame({ t: 5, r: 12.5 })))).toEqual({ t: 5 });
    expect(() => parsePing(one(encodeFrame(FrameType.PING, { t: 5, r: -1 })))).toThrow(FrameError);
    expect(() => parsePing(one(encodeFrame(FrameType.PING, { t: 5, r: "1" })))).toThrow(FrameError);
  });

  test("HELLO carries start: earliest only when asked, and reads it back", () => {
    expect(parseHello(one(helloFrame({ ...hello, start: "earliest" })))).toEqual({ ...hello, start: "earliest" });
    expect(hex(helloFrame({ ...hello }))).toBe(GOLDEN[0]![2]);
  });

  test("the hand-written BATCH encoder gives the generic encoder's bytes at every size boundary", () => {
    const sizes = [1, 31, 32, 255, 256, 65_535, 65_536];
    const seqs = [1, 127, 128, 255, 256, 65_535, 65_536, 2 ** 32 - 1];
    for (const count of [1, 15, 16]) {
      for (const size of sizes) {
        const records = Array.from({ length: count }, (_, i) => new Uint8Array(size).fill(i + 1));
        // Rising seqs across the integer forms: small ones, 16- and 32-bit, and (for 15) past 32 bits.
        const list =
          count === 1
            ? [seqs[sizes.indexOf(size)]!]
            : count === 15
              ? Array.from({ length: 15 }, (_, i) => seqs[i % 8]! + Math.floor(i / 8) * 2 ** 33)
              : Array.from({ length: 16 }, (_, i) => 100 + i * 9_000);
        const bt = { batch: 70_000, channel: "c".repeat(count === 16 ? 40 : 3), seqs: list.sort((a, b) => a - b), records };
        const generic = encodeFrame(FrameType.BATCH, { n: bt.batch, c: bt.channel, s: bt.seqs, r: bt.records });
        const mine = batchFrame(bt);
        if (bt.seqs.every((q) => q <= 0xffffffff)) expect(hex(mine)).toBe(hex(generic));
        // From records as a forwarder holds them (seq and body each), with and without d: the same bytes.
        const items = bt.seqs.map((seq, i) => ({ seq, body: records[i]! }));
        expect(hex(batchFrameOf(bt.batch, bt.channel, items, false))).toBe(hex(mine));
        expect(hex(batchFrameOf(bt.batch, bt.channel, items, true))).toBe(hex(batchFrame({ ...bt, delayAck: true })));
        // Seqs past 32 bits: msgpackr may pick another integer form; both must read back the same.
        const back = parseBatch(one2(mine));
        expect(back.seqs).toEqual(bt.seqs);
        expect(back.records.map((r) => r.length)).toEqual(records.map((r) => r.length));
        expect(back.records[count - 1]![size - 1]).toBe(count);
      }
    }
    expect(() => batchFrame({ batch: 1, channel: "t.a", seqs: [1], records: [new Uint8Array(2000)] }, 1000)).toThrow(FrameError);
    expect(() => batchFrameOf(1, "t.a", [{ seq: 1, body: new Uint8Array(2000) }], false, 1000)).toThrow(FrameError);
  });

  test("ACK written by hand: the generic encoder's bytes for every integer form and channel length", () => {
    for (const n of [1, 127, 128, 255, 256, 65_535, 65_536, 2 ** 32 - 1])
      for (const upto of [1, 200, 70_000, 2 ** 32 - 1])
        for (const c of ["t", "c".repeat(31), "c".repeat(32), "c".repeat(255)]) {
          expect(hex(ackFrame({ batch: n, channel: c, upto }))).toBe(hex(encodeFrame(FrameType.ACK, { n, c, u: upto })));
          expect(parseAck(one2(ackFrame({ batch: n, channel: c, upto })))).toEqual({ batch: n, channel: c, upto });
        }
    // Past 32 bits msgpackr may pick another form: it must read back the same.
    expect(parseAck(one2(ackFrame({ batch: 3, channel: "t.a", upto: 2 ** 40 + 5 })))).toEqual({ batch: 3, channel: "t.a", upto: 2 ** 40 + 5 });
  });

  test("BATCH carries d: true only when the sender lets the ACK wait, and reads it back", () => {
    const bt = { batch: 3, channel: "t.a", seqs: [7], records: [new Uint8Array([0x80])] };
    const withD = batchFrame({ ...bt, delayAck: true });
    expect(hex(withD)).toBe(hex(encodeFrame(FrameType.BATCH, { n: 3, c: "t.a", s: [7], r: bt.records, d: true })));
    expect(parseBatch(one2(withD)).delayAck).toBe(true);
    expect(hex(batchFrame({ ...bt, delayAck: false }))).toBe(hex(batchFrame(bt)));
    expect(parseBatch(one2(batchFrame(bt))).delayAck).toBeUndefined();
    expect(() => parseBatch(one2(encodeFrame(FrameType.BATCH, { n: 3, c: "t.a", s: [7], r: bt.records, d: "yes" })))).toThrow(FrameError);
  });

  test("frames split at every byte, and many frames in one chunk, decode the same", () => {
    const all = new Uint8Array(GOLDEN.reduce((n, g) => n + g[1].length, 0));
    let off = 0;
    for (const [, b] of GOLDEN) {
      all.set(b, off);
      off += b.length;
    }
    const whole = new FrameDecoder(1 << 20).push(all);
    expect(whole.map((f) => f.type)).toEqual([1, 2, 3, 4, 5, 6, 7]);
    const d = new FrameDecoder(1 << 20);
    const bytewise: Frame[] = [];
    for (let i = 0; i < all.length; i++) bytewise.push(...d.push(all.subarray(i, i + 1)));
    expect(bytewise).toEqual(whole);
    expect(d.buffered).toBe(0);
    // Chunks of every size up to a few frames: whole frames, rests and split headers mixed.
    for (let step = 2; step <= 97; step += 5) {
      const e = new FrameDecoder(1 << 20);
      const got: Frame[] = [];
      for (let i = 0; i < all.length; i += step) {
        got.push(...e.push(all.subarray(i, i + step)));
        expect(e.buffered).toBe(Math.min(i + step, all.length) - got.reduce((n, f) => n + f.size, 0));
      }
      expect(got).toEqual(whole);
      expect(e.buffered).toBe(0);
    }
  });

  test("frames stay intact when the caller reuses its chunk, as a socket does its buffer; decoders may share blocks", () => {
    const blocks = new CopyBlocks(256);
    const d1 = new FrameDecoder(1 << 20, blocks);
    const d2 = new FrameDecoder(1 << 20, blocks);
    const socketBuffer = new Uint8Array(512);
    const got: Frame[] = [];
    let want = 0;
    for (let i = 0; i < 40; i++) {
      const bytes = batchFrame({ batch: i + 1, channel: "t.a", seqs: [i + 1], records: [new Uint8Array(20 + i * 3).fill(i)] });
      // Each frame handed over in two pieces, through the same buffer, alternating decoders.
      const d = i % 2 === 0 ? d1 : d2;
      const cut = bytes.length >> 1;
      socketBuffer.set(bytes.subarray(0, cut));
      got.push(...d.push(socketBuffer.subarray(0, cut)));
      socketBuffer.fill(0xee);
      socketBuffer.set(bytes.subarray(cut));
      got.push(...d.push(socketBuffer.subarray(0, bytes.length - cut)));
      socketBuffer.fill(0xee);
      want++;
    }
    expect(got.length).toBe(want);
    got.forEach((f, i) => {
      const b = parseBatch(f);
      expect(b.batch).toBe(i + 1);
      expect(b.records[0]).toEqual(new Uint8Array(20 + i * 3).fill(i));
    });
  });

  test("the size limit is checked on the header, before the body is kept", () => {
    const d = new FrameDecoder(1000);
    const header = new Uint8Array([0x4b, 0x59, 1, FrameType.BATCH, 0x7f, 0xff, 0xff, 0xff]);
    expect(() => d.push(header)).toThrow("exceeds the limit of 1000");
    expect(d.buffered).toBe(0);
    expect(() => d.push(new Uint8Array([1]))).toThrow(FrameError); // stays failed
    expect(() => encodeFrame(FrameType.BATCH, { r: [new Uint8Array(2000)] }, 1000)).toThrow("exceeds 1000");
  });

  const malformed: [string, string][] = [
    ["bad magic", "4b58010500000006de0001a17401"],
    ["unknown version", "4b59020500000006de0001a17401"],
    ["unknown type", "4b59016300000006de0001a17401"],
    ["empty body", "4b59010500000000"],
    ["body not msgpack", "4b59010500000001c1"],
    ["body not a map", "4b5901050000000192"],
    ["body a binary", "4b5901050000000ac408000000000000000000"],
  ];
  test.each(malformed)("%s is a FrameError", (_what, h) => {
    expect(() => new FrameDecoder(1 << 20).push(unhex(h))).toThrow(FrameError);
  });

  const badMessages: [string, () => unknown][] = [
    ["channel with a path", () => parseBatch(one(encodeFrame(FrameType.BATCH, { n: 1, c: "../etc", s: [1], r: [new Uint8Array([1])] })))],
    ["channel with a slash", () => parseBatch(one(encodeFrame(FrameType.BATCH, { n: 1, c: "a/b", s: [1], r: [new Uint8Array([1])] })))],
    ["seqs and records of different lengths", () => parseBatch(one(encodeFrame(FrameType.BATCH, { n: 1, c: "a", s: [1, 2], r: [new Uint8Array([1])] })))],
    ["seqs not rising", () => parseBatch(one(encodeFrame(FrameType.BATCH, { n: 1, c: "a", s: [2, 2], r: [new Uint8Array([1]), new Uint8Array([1])] })))],
    ["a record that is not binary", () => parseBatch(one(encodeFrame(FrameType.BATCH, { n: 1, c: "a", s: [1], r: ["text"] })))],
    ["an empty batch", () => parseBatch(one(encodeFrame(FrameType.BATCH, { n: 1, c: "a", s: [], r: [] })))],
    ["a bad pattern in HELLO", () => parseHello(one(encodeFrame(FrameType.HELLO, { v: [1], name: "x", mode: "link", pub: ["a.>.b"], sub: [], hb: 1000, mbb: 4096 })))],
    ["an unknown mode", () => parseHello(one(encodeFrame(FrameType.HELLO, { v: [1], name: "x", mode: "admin", pub: [], sub: [], hb: 1000, mbb: 4096 })))],
    ["no versions", () => parseHello(one(encodeFrame(FrameType.HELLO, { v: [], name: "x", mode: "link", pub: [], sub: [], hb: 1000, mbb: 4096 })))],
    ["a heartbeat of 0", () => parseHello(one(encodeFrame(FrameType.HELLO, { v: [1], name: "x", mode: "link", pub: [], sub: [], hb: 0, mbb: 4096 })))],
    ["an ACK of seq 0", () => parseAck(one(encodeFrame(FrameType.ACK, { n: 1, c: "a", u: 0 })))],
    ["the wrong frame type", () => parseAck(one(pingFrame({ t: 1 })))],
  ];
  test.each(badMessages)("message validation refuses %s", (_what, fn) => {
    expect(fn).toThrow(FrameError);
  });
});

/** xorshift32: fuzz inputs are reproducible from the printed seed. */
function rng(seed: number) {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) / 0x1_0000_0000;
  };
}

/** Feeds `input` in random chunks; returns the number of frames, or -1 after a FrameError. Anything else escapes. */
function feed(input: Uint8Array, rand: () => number, maxBody: number): number {
  const d = new FrameDecoder(maxBody);
  let frames = 0;
  try {
    for (let off = 0; off < input.length; ) {
      const n = 1 + Math.floor(rand() * 64);
      for (const f of d.push(input.subarray(off, off + n))) {
        frames++;
        for (const parse of [parseHello, parseWelcome, parseBatch, parseAck, parsePing, parseClose]) {
          try {
            parse(f);
          } catch (err) {
            if (!(err instanceof FrameError)) throw err;
          }
        }
      }
      if (d.buffered > HEADER_BYTES + maxBody) throw new Error(`decoder holds ${d.buffered} bytes, over its limit`);
      off += n;
    }
  } catch (err) {
    if (err instanceof FrameError) return -1;
    throw err;
  }
  return frames;
}

describe("fuzz", () => {
  test("100,000 random and mutated inputs: only FrameErrors, never more buffered than the limit", () => {
    const seed = Number(process.env.FUZZ_SEED ?? Date.now() % 1_000_000);
    const count = Number(process.env.FUZZ_CASES ?? 100_000);
    const rand = rng(seed);
    const valid = GOLDEN.map((g) => g[1]);
    let framesOk = 0;
    let rejected = 0;
    for (let i = 0; i < count; i++) {
      let input: Uint8Array;
      const kind = i % 4;
      if (kind === 0) {
        input = new Uint8Array(4 + Math.floor(rand() * 256));
        for (let k = 0; k < input.length; k++) input[k] = Math.floor(rand() * 256);
        if (rand() < 0.5) input.set([0x4b, 0x59, 1, 1 + Math.floor(rand() * 7)]); // a plausible header
      } else {
        const base = valid[Math.floor(rand() * valid.length)]!;
        input = base.slice();
        const flips = 1 + Math.floor(rand() * 4);
        for (let k = 0; k < flips; k++) {
          const at = Math.floor(rand() * input.length);
          if (kind === 1) input[at]! ^= 1 << Math.floor(rand() * 8);
          else if (kind === 2) input[at] = Math.floor(rand() * 256);
          else input = input.subarray(0, at); // truncation
        }
      }
      const r = feed(input, rand, 4096);
      if (r < 0) rejected++;
      else framesOk += r;
    }
    console.log(`fuzz: ${count} inputs (seed ${seed}): ${rejected} rejected with FrameError, ${framesOk} frames decoded, nothing else thrown`);
    expect(rejected).toBeGreaterThan(count / 4);
    expect(framesOk).toBeGreaterThan(count / 20); // both paths exercised: frames decoded and frames refused
  }, 120_000);
});
