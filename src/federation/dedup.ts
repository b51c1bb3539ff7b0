/**
 * Duplicate suppression: the ids of recently stored messages, bounded.
 *
 * After a lost ACK the sender resends what the receiver already stored; the
 * receiver drops those by id. A Map keeps insertion order, so the oldest id
 * is evicted first once `capacity` is reached (docs/protocol.md; `dedup.capacity` in docs/config.md).
 */
export class RecentIds {
  readonly capacity: number;
  private readonly ids = new Map<string, true>();
  /**
   * One live iterator over `ids`, kept across calls: it yields keys in
   * insertion order and skips deleted ones, so it always stands at the
   * oldest id (a new iterator per eviction showed in profiles).
   */
  private readonly oldest = this.ids.keys();

  constructor(capacity: number) {
    this.capacity = Math.max(0, Math.floor(capacity));
  }

  /** True if `id` was seen recently (and refreshes it); otherwise records it and returns false. */
  seen(id: string): boolean {
    if (this.capacity === 0) return false;
    // One lookup for a new id (the usual case): the size tells whether the set added it.
    const before = this.ids.size;
    this.ids.set(id, true);
    if (this.ids.size === before) {
      this.ids.delete(id);
      this.ids.set(id, true);
      return true;
    }
    if (this.ids.size > this.capacity) this.ids.delete(this.oldest.next().value!);
    return false;
  }

  /** True if `id` is remembered, without recording or refreshing it. */
  has(id: string): boolean {
    return this.ids.has(id);
  }

  /** Ids remembered now. */
  get size(): number {
    return this.ids.size;
  }
}
