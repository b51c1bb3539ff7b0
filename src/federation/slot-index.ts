/**
 * A hash table from 53-bit keys (hashes already) to slot numbers, kept in
 * typed arrays: open addressing with linear probing, at most half full,
 * deletion by shifting the entries behind back (no tombstones).
 *
 * It is the index of the dedup ring (dedup.ts), written on every message a
 * hub or a device stores from a link. A Map of 100,000 numbers there was
 * re-scanned by every young collection once written to (its table is one
 * object the collector remembers), which lengthened each pause; typed
 * arrays hold no references, so the collector never looks inside them.
 */

/** No key in a bucket (keys are 0 .. 2^53-1). */
const EMPTY = -1;
/** Buckets at first; doubled while more than half are taken. */
const MIN_BUCKETS = 1024;

export class SlotIndex {
  private keys: Float64Array;
  private slots: Int32Array;
  private mask: number;
  private count = 0;

  /** `buckets`: the table's first size (a power of two at least MIN_BUCKETS is used). */
  constructor(buckets = MIN_BUCKETS) {
    let n = MIN_BUCKETS;
    while (n < buckets) n *= 2;
    this.keys = new Float64Array(n).fill(EMPTY);
    this.slots = new Int32Array(n);
    this.mask = n - 1;
  }

  /** Keys held. */
  get size(): number {
    return this.count;
  }

  /** The slot of `key`, or -1. */
  get(key: number): number {
    const keys = this.keys;
    for (let i = this.home(key); ; i = (i + 1) & this.mask) {
      const k = keys[i]!;
      if (k === key) return this.slots[i]!;
      if (k === EMPTY) return -1;
    }
  }

  /** Sets `key`'s slot (0 .. 2^31-1), adding the key if it is new. */
  set(key: number, slot: number): void {
    if (2 * (this.count + 1) > this.keys.length) this.grow();
    const keys = this.keys;
    let i = this.home(key);
    for (; keys[i] !== EMPTY; i = (i + 1) & this.mask) {
      if (keys[i] === key) {
        this.slots[i] = slot;
        return;
      }
    }
    keys[i] = key;
    this.slots[i] = slot;
    this.count++;
  }

  /** Removes `key` if held. */
  delete(key: number): void {
    const keys = this.keys;
    const mask = this.mask;
    let i = this.home(key);
    while (keys[i] !== key) {
      if (keys[i] === EMPTY) return;
      i = (i + 1) & mask;
    }
    // Entries after the hole that would no longer be found across it move back into it.
    for (let j = (i + 1) & mask; keys[j] !== EMPTY; j = (j + 1) & mask) {
      const h = this.home(keys[j]!);
      // Stays where it is when its home lies cyclically in (i, j].
      const stays = i < j ? i < h && h <= j : i < h || h <= j;
      if (stays) continue;
      keys[i] = keys[j]!;
      this.slots[i] = this.slots[j]!;
      i = j;
    }
    keys[i] = EMPTY;
    this.count--;
  }

  /** The bucket a key is looked for first. */
  private home(key: number): number {
    // Low and high words mixed: a key's bits are a hash already, the multiply spreads them.
    const lo = key >>> 0;
    const hi = (key / 0x1_0000_0000) >>> 0;
    return Math.imul(lo ^ Math.imul(hi, 0x9e3779b1), 0x85ebca6b) & this.mask;
  }

  private grow(): void {
    const keys = this.keys;
    const slots = this.slots;
    const n = keys.length * 2;
    this.keys = new Float64Array(n).fill(EMPTY);
    this.slots = new Int32Array(n);
    this.mask = n - 1;
    this.count = 0;
    for (let i = 0; i < keys.length; i++) if (keys[i] !== EMPTY) this.set(keys[i]!, slots[i]!);
  }
}
