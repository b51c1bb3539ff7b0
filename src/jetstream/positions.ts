/**
 * Where each board is in each stream: the last stream sequence it
 * acknowledged, kept in a replicated JetStream key-value bucket so that a
 * board that reconnects to another hub of the tier resumes there. Writes
 * are coalesced per key (one in flight, the newest value next), so a busy
 * board costs one write per round trip to the cluster, not one per batch.
 */
import type { KV } from "nats";
import type { Logger } from "../observability/logger.ts";

/** Positions by key (tier, peer and stream). */
export interface PositionStore {
  get(key: string): Promise<number | null>;
  /** Records `seq` for `key` (never moving back); written soon. */
  put(key: string, seq: number): void;
  /** Resolves when what was put for `key` is written (or the write failed and was logged). */
  flush(key: string): Promise<void>;
}

/** The key of a board's position in a stream. */
export function positionKey(tier: string, peer: string, stream: string): string {
  return `${tier}.${peer}.${stream}`;
}

interface Slot {
  want: number;
  written: number;
  writing: Promise<void> | null;
}

/** PositionStore on a JetStream KV bucket. */
export class KvPositions implements PositionStore {
  private readonly kv: KV;
  private readonly logger: Logger;
  private readonly slots = new Map<string, Slot>();
  /** Writes that failed (each tried again with the next put or flush). */
  failedWrites = 0;

  constructor(kv: KV, logger: Logger) {
    this.kv = kv;
    this.logger = logger;
  }

  async get(key: string): Promise<number | null> {
    const e = await this.kv.get(key);
    if (e?.operation !== "PUT" || e.value.length === 0) return null;
    const n = Number(e.string());
    return Number.isSafeInteger(n) && n >= 0 ? n : null;
  }

  put(key: string, seq: number): void {
    let s = this.slots.get(key);
    if (!s) {
      s = { want: seq, written: -1, writing: null };
      this.slots.set(key, s);
    }
    if (seq > s.want) s.want = seq;
    if (!s.writing) s.writing = this.write(key, s);
  }

  async flush(key: string): Promise<void> {
    const s = this.slots.get(key);
    if (!s) return;
    if (!s.writing && s.want > s.written) s.writing = this.write(key, s);
    await s.writing;
  }

  private async write(key: string, s: Slot): Promise<void> {
    try {
      while (s.want > s.written) {
        const v = s.want;
        await this.kv.put(key, String(v));
        s.written = v;
      }
    } catch (err) {
      this.failedWrites++;
      this.logger.warn("could not write a board's stream position (written again with the next ack)", { key, error: String(err) });
    } finally {
      s.writing = null;
    }
  }
}

/** PositionStore in memory, for tests of the code above it. */
export class MemoryPositions implements PositionStore {
  readonly values = new Map<string, number>();
  async get(key: string): Promise<number | null> {
    return this.values.get(key) ?? null;
  }
  put(key: string, seq: number): void {
    this.values.set(key, Math.max(seq, this.values.get(key) ?? -1));
  }
  async flush(): Promise<void> {}
}
