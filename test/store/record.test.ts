import { describe, expect, test } from "bun:test";
import { encodeRecords, MAX_RECORD_BODY, RECORD_HEADER_BYTES, scanRecords } from "../../src/store/record.ts";

const body = (n: number, fill = 0xab) => new Uint8Array(n).fill(fill);

describe("record codec", () => {
  test("golden bytes: header layout is length | crc32 | seq (LE)", () => {
    const buf = encodeRecords(0x1_0000_0002, [new TextEncoder().encode("hi")]);
    const hex = Buffer.from(buf).toString("hex");
    // length 2, crc32 over seq+body, seq 0x100000002 little-endian, body "hi"
    const crc = Bun.hash.crc32(buf.subarray(8)).toString(16).padStart(8, "0");
    const crcLE = crc.match(/../g)!.reverse().join("");
    expect(hex).toBe("02000000" + crcLE + "0200000001000000" + "6869");
    // An independent CRC-32 (IEEE) of the same bytes: zlib's value for this input.
    expect(crc).toBe(Buffer.from(buf.subarray(4, 8)).reverse().toString("hex"));
  });

  test("every record's CRC is that of its seq and body bytes together, for seqs past 32 bits and several records in one buffer", () => {
    for (const first of [0, 1, 0xffff_fffe, 0x1_0000_0000, 2 ** 40 + 5, 2 ** 53 - 4]) {
      const bodies = [body(1, 1), body(100, 2), body(5000, 3)];
      const buf = encodeRecords(first, bodies);
      let off = 0;
      for (const b of bodies) {
        const end = off + RECORD_HEADER_BYTES + b.length;
        const stored = new DataView(buf.buffer, buf.byteOffset).getUint32(off + 4, true);
        expect(stored).toBe(Bun.hash.crc32(Uint8Array.from(buf.subarray(off + 8, end))));
        off = end;
      }
      expect(scanRecords(buf, 0, first).stop).toBe("end");
    }
  });

  test("scan visits consecutive records and stops cleanly at the end", () => {
    const buf = encodeRecords(5, [body(10), body(20), body(30)]);
    const seen: number[] = [];
    const r = scanRecords(buf, 0, 5, (seq) => void seen.push(seq));
    expect(seen).toEqual([5, 6, 7]);
    expect(r).toEqual({ end: buf.length, lastSeq: 7, stop: "end" });
  });

  test("scan reports a torn record as partial, at the start of that record", () => {
    const buf = encodeRecords(1, [body(10), body(20)]);
    const firstEnd = RECORD_HEADER_BYTES + 10;
    for (let cut = firstEnd + 1; cut < buf.length; cut++) {
      const r = scanRecords(buf.subarray(0, cut), 0, 1);
      expect(r).toEqual({ end: firstEnd, lastSeq: 1, stop: "partial" });
    }
  });

  test("a flipped bit anywhere in a record is caught", () => {
    const clean = encodeRecords(1, [body(8), body(8)]);
    for (let i = RECORD_HEADER_BYTES + 8; i < clean.length; i++) {
      const buf = clean.slice();
      buf[i]! ^= 0x10;
      const r = scanRecords(buf, 0, 1);
      expect(r.lastSeq).toBe(1);
      expect(r.stop).not.toBe("end");
    }
  });

  test("zero-filled tail, absurd lengths and seq gaps stop the scan", () => {
    const good = encodeRecords(1, [body(4)]);
    const zeros = new Uint8Array(good.length + 64);
    zeros.set(good);
    expect(scanRecords(zeros, 0, 1)).toMatchObject({ end: good.length, lastSeq: 1, stop: "bad_length" });
    const huge = good.slice();
    new DataView(huge.buffer).setUint32(0, MAX_RECORD_BODY + 1, true);
    expect(scanRecords(huge, 0, 1).stop).toBe("bad_length");
    expect(scanRecords(good, 0, 2).stop).toBe("bad_seq");
  });
});
