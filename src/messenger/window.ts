/**
 * How much a consumer may have been sent and not yet have acknowledged:
 * deliveries (a count) and bytes. Several readers may draw on one window:
 * an MQTT session's receive maximum spans all its subscriptions and its
 * retained messages, a federation session's window all its patterns.
 */
export class Window {
  private max: number;
  private readonly maxBytes: number;
  private used = 0;
  private usedBytes = 0;
  private readonly listeners = new Set<() => void>();

  /** `max` deliveries and about `maxBytes` bytes in flight (one delivery always fits an empty window). */
  constructor(max: number, maxBytes = Number.POSITIVE_INFINITY) {
    this.max = max;
    this.maxBytes = maxBytes;
  }

  /** Deliveries that may still be taken now. */
  room(): number {
    if (this.used > 0 && this.usedBytes >= this.maxBytes) return 0;
    return Math.max(0, this.max - this.used);
  }

  /** Deliveries taken and not given back. */
  get inflight(): number {
    return this.used;
  }

  /** Changes the most deliveries in flight (a client that states its own maximum). */
  resize(max: number): void {
    const grew = max > this.max;
    this.max = max;
    if (grew) this.notify();
  }

  /** Takes `count` units (deliveries or records, as the readers count) of `bytes` in all. */
  take(bytes: number, count = 1): void {
    this.used += count;
    this.usedBytes += bytes;
  }

  /** `count` units of `bytes` in all were acknowledged: everyone drawing on the window may go on. */
  give(bytes: number, count = 1): void {
    this.used -= count;
    this.usedBytes -= bytes;
    this.notify();
  }

  /** Calls `fn` whenever room may have opened; returns the remover. */
  onRoom(fn: () => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  private notify(): void {
    for (const fn of this.listeners) fn();
  }
}
