import { describe, expect, test } from "bun:test";
import { SlotIndex } from "../../src/federation/slot-index.ts";
import { rng } from "../helpers.ts";

/** A key of all 53 bits (one draw gives only 32). */
const key53 = (next: () => number) => Math.floor(next() * 2 ** 21) * 0x1_0000_0000 + Math.floor(next() * 0x1_0000_0000);

describe("SlotIndex", () => {
  test("get, set, overwrite and delete, at the ends of the key range", () => {
    const ix = new SlotIndex();
    expect(ix.get(0)).toBe(-1);
    ix.set(0, 5);
    ix.set(2 ** 53 - 1, 7);
    ix.set(0x1_0000_0000, 9); // the same low word as 0
    expect([ix.get(0), ix.get(2 ** 53 - 1), ix.get(0x1_0000_0000), ix.size]).toEqual([5, 7, 9, 3]);
    ix.set(0, 6);
    expect([ix.get(0), ix.size]).toEqual([6, 3]);
    ix.delete(0);
    ix.delete(12345); // not held: nothing happens
    expect([ix.get(0), ix.get(2 ** 53 - 1), ix.get(0x1_0000_0000), ix.size]).toEqual([-1, 7, 9, 2]);
  });

  test("against a Map, with runs of neighbours and deletions in the middle of probe chains, across growth", () => {
    for (const seed of [1, 2, 3]) {
      const next = rng(seed);
      const ix = new SlotIndex();
      const model = new Map<number, number>();
      // A small pool of keys, so that sets, overwrites and deletes hit the same ones often.
      const pool = Array.from({ length: 3000 }, () => key53(next));
      for (let op = 0; op < 60_000; op++) {
        const key = pool[Math.floor(next() * pool.length)]!;
        const r = next();
        if (r < 0.55) {
          const slot = Math.floor(next() * 2 ** 31);
          ix.set(key, slot);
          model.set(key, slot);
        } else if (r < 0.85) {
          ix.delete(key);
          model.delete(key);
        } else expect(ix.get(key)).toBe(model.get(key) ?? -1);
        if (op % 5000 === 0) {
          expect(ix.size).toBe(model.size);
          for (const k of pool) expect(ix.get(k)).toBe(model.get(k) ?? -1);
        }
      }
      expect(ix.size).toBe(model.size);
      for (const k of pool) expect(ix.get(k)).toBe(model.get(k) ?? -1);
    }
  });

  test("a full ring's worth: 100,000 keys in, the oldest deleted as new ones come, as the dedup ring does", () => {
    const next = rng(9);
    const ix = new SlotIndex();
    const ring: number[] = [];
    const cap = 100_000;
    for (let i = 0; i < 250_000; i++) {
      const key = key53(next);
      if (ring.length === cap) ix.delete(ring[i % cap]!);
      ring[i % cap] = key;
      ix.set(key, i % cap);
    }
    expect(ix.size).toBe(cap);
    for (let s = 0; s < cap; s++) expect(ix.get(ring[s]!)).toBe(s);
  });
});
