/**
 * Duplicate suppression: the ids of recently stored messages, bounded.
 *
 * After a lost ACK the sender resends what the receiver already stored; the
 * receiver drops those by id (docs/protocol.md; `dedup.capacity` in
 * docs/config.md).
 *
 * The ids live outside the garbage collector's reach: each id's bytes in a
 * ring of fixed-size slots (typed arrays, which a collection never scans),
 * found through an index from a 53-bit hash of the id to its slot, in
 * typed arrays too (slot-index.ts). A Map of 100,000 id strings, one new
 * young string added per message, was scanned whole by every young
 * collection (its table was remembered each time a young key went in): a
 * quarter of each pause; a Map of numbers written on every message was
 * still re-scanned by each one.
 * Every hit is checked against the stored bytes, so two ids that share a
 * hash are never taken for each other; the older one is forgotten instead,
 * which can only let a duplicate through, never drop a message.
 */

import { SlotIndex } from "./slot-index.ts";

/** Bytes of a slot: a length byte and up to SLOT_BYTES - 1 ASCII characters (a UUID takes 36). */
const SLOT_BYTES = 48;
/** Slots per chunk of the ring (2^CHUNK_BITS), allocated as the ring first fills. */
const CHUNK_BITS = 14;
const CHUNK_SLOTS = 1 << CHUNK_BITS;

/** A hash of `id` in 53 bits (two 32-bit FNV-style lanes), or -1 if `id` does not fit a slot. */
export function slotKey(id: string): number {
  const n = id.length;
  if (n >= SLOT_BYTES) return -1;
  let h1 = 0x811c9dc5;
  let h2 = 0x9747b28c;
  for (let i = 0; i < n; i++) {
    const c = id.charCodeAt(i);
    if (c > 0x7f) return -1;
    h1 = Math.imul(h1 ^ c, 0x01000193);
    h2 = Math.imul(h2 ^ c, 0x5bd1e995);
    h2 ^= h2 >>> 15;
  }
  return (h1 >>> 0) * 0x200000 + ((h2 >>> 0) & 0x1fffff);
}

/** The recently seen ids, up to a capacity, the least recently seen forgotten first. */
export class RecentIds {
  readonly capacity: number;
  /** Hash of an id -> its slot in the ring. */
  private readonly slots = new SlotIndex();
  /** The ring's id bytes and each slot's hash, by chunk. */
  private readonly bytes: Uint8Array[] = [];
  private readonly keys: Float64Array[] = [];
  /** Next slot to write; slots at and after it (cyclically) are the oldest. */
  private next = 0;
  /**
   * Ids that do not fit a slot (longer, or not ASCII), in a Map of their
   * own, oldest first; rare, so its cost to the collector does not matter.
   */
  private readonly others = new Map<string, true>();
  /** One live iterator over `others`, always at its oldest id. */
  private readonly othersOldest = this.others.keys();

  private readonly keyOf: (id: string) => number;
  /** The last id hashed and its hash: a receiver asks `has` and then `seen` of the same id. */
  private lastId = "";
  private lastKey = -1;

  private key(id: string): number {
    if (id !== this.lastId) {
      this.lastId = id;
      this.lastKey = this.keyOf(id);
    }
    return this.lastKey;
  }

  /** `keyOf`: the hash of an id that fits a slot, else -1 (a test may make ids collide). */
  constructor(capacity: number, keyOf: (id: string) => number = slotKey) {
    this.capacity = Math.max(0, Math.floor(capacity));
    this.keyOf = keyOf;
  }

  /** The hash `has` and `seen` take for `id` (a caller that asks both of many ids passes it back). */
  hash(id: string): number {
    return this.key(id);
  }

  /** True if `id` was seen recently (and refreshes it); otherwise records it and returns false. `key`: its `hash`. */
  seen(id: string, key = this.key(id)): boolean {
    if (this.capacity === 0) return false;
    if (key < 0) return this.seenOther(id);
    const had = this.find(id, key) >= 0;
    // A refreshed id takes a new slot; its old one is left behind and skipped when its turn comes.
    this.write(id, key);
    return had;
  }

  /** True if `id` is remembered, without recording or refreshing it. `key`: its `hash`. */
  has(id: string, key = this.key(id)): boolean {
    if (this.capacity === 0) return false;
    return key < 0 ? this.others.has(id) : this.find(id, key) >= 0;
  }

  /** Ids remembered now (at most `capacity` of each kind; fewer after refreshes). */
  get size(): number {
    return this.slots.size + this.others.size;
  }

  /** The slot holding `id` (whose hash is `key`), or -1. */
  private find(id: string, key: number): number {
    const s = this.slots.get(key);
    if (s < 0) return -1;
    const b = this.bytes[s >>> CHUNK_BITS]!;
    const at = (s & (CHUNK_SLOTS - 1)) * SLOT_BYTES;
    const n = id.length;
    if (b[at] !== n) return -1;
    for (let i = 0; i < n; i++) if (b[at + 1 + i] !== id.charCodeAt(i)) return -1;
    return s;
  }

  /** Writes `id` into the next slot, forgetting the id there. */
  private write(id: string, key: number): void {
    const s = this.next;
    this.next = s + 1 === this.capacity ? 0 : s + 1;
    const chunk = s >>> CHUNK_BITS;
    if (chunk === this.bytes.length) {
      const slots = Math.min(CHUNK_SLOTS, this.capacity - chunk * CHUNK_SLOTS);
      this.bytes.push(new Uint8Array(slots * SLOT_BYTES));
      this.keys.push(new Float64Array(slots).fill(-1));
    }
    const keys = this.keys[chunk]!;
    const i = s & (CHUNK_SLOTS - 1);
    const old = keys[i]!;
    // The slot's id is forgotten, unless it was refreshed into a newer slot (or its hash taken over).
    if (old >= 0 && this.slots.get(old) === s) this.slots.delete(old);
    keys[i] = key;
    const b = this.bytes[chunk]!;
    const at = i * SLOT_BYTES;
    const n = id.length;
    b[at] = n;
    for (let k = 0; k < n; k++) b[at + 1 + k] = id.charCodeAt(k);
    this.slots.set(key, s);
  }

  private seenOther(id: string): boolean {
    const o = this.others;
    if (o.has(id)) {
      o.delete(id);
      o.set(id, true);
      return true;
    }
    o.set(id, true);
    if (o.size > this.capacity) o.delete(this.othersOldest.next().value!);
    return false;
  }
}
