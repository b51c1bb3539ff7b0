import { describe, expect, test } from "bun:test";
import { CopyBlocks, Scratch } from "../src/bytes.ts";

describe("CopyBlocks", () => {
  test("copies are equal to their chunks and stay so when the chunk is reused, across blocks", () => {
    const blocks = new CopyBlocks(1024);
    const source = new Uint8Array(200);
    const copies: { copy: Uint8Array; want: Uint8Array }[] = [];
    for (let i = 0; i < 50; i++) {
      const n = 1 + ((i * 37) % 200);
      source.fill(i % 256, 0, n);
      const chunk = source.subarray(0, n);
      copies.push({ copy: blocks.copy(chunk), want: chunk.slice() });
      // The socket reuses its buffer after the callback.
      source.fill(0xee);
    }
    for (const { copy, want } of copies) expect(copy).toEqual(want);
  });

  test("small copies share a block and never overlap; a large one gets an ArrayBuffer of its own", () => {
    const blocks = new CopyBlocks(1024);
    const a = blocks.copy(new Uint8Array(100).fill(1));
    const b = blocks.copy(new Uint8Array(100).fill(2));
    expect(a.buffer).toBe(b.buffer);
    expect(b.byteOffset).toBeGreaterThanOrEqual(a.byteOffset + a.length);
    const big = blocks.copy(new Uint8Array(300).fill(3));
    expect(big.buffer).not.toBe(a.buffer);
    expect(big.byteLength).toBe(300);
    // A chunk that does not fit the rest of the block starts a new one; the old copies are intact.
    const parts = Array.from({ length: 5 }, (_, i) => blocks.copy(new Uint8Array(250).fill(10 + i)));
    expect(parts[4]!.buffer).not.toBe(a.buffer);
    expect([...a].every((x) => x === 1) && [...b].every((x) => x === 2)).toBe(true);
    for (let i = 0; i < parts.length; i++) expect(parts[i]!.every((x) => x === 10 + i)).toBe(true);
    expect(Buffer.isBuffer(a) && Buffer.isBuffer(big)).toBe(true);
  });
});

describe("Scratch", () => {
  test("hands back one buffer while requests fit, grows it, and gives a request over the limit an array of its own", () => {
    const s = new Scratch(64 * 1024);
    const a = s.take(100);
    expect(a.length).toBeGreaterThanOrEqual(100);
    expect(s.take(a.length)).toBe(a);
    const grown = s.take(a.length + 1);
    expect(grown).not.toBe(a);
    expect(grown.length).toBeGreaterThanOrEqual(a.length + 1);
    expect(s.take(10)).toBe(grown);
    const full = s.take(64 * 1024);
    expect(full.length).toBe(64 * 1024);
    // Over the limit: a new array each time, and the kept one stays.
    const big = s.take(64 * 1024 + 1);
    expect(big.length).toBe(64 * 1024 + 1);
    expect(big).not.toBe(full);
    expect(s.take(64 * 1024 + 1)).not.toBe(big);
    expect(s.take(1)).toBe(full);
  });
});
