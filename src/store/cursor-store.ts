/**
 * Durable subscriber cursors: one small JSON file per subscriber.
 *
 * Acks only touch memory and mark the subscriber dirty; a timer (and close)
 * writes every dirty file atomically (temp file, fsync, rename, one
 * directory fsync per round), so acking costs no fsync per message. A crash
 * between an ack and the next flush redelivers, which at-least-once allows.
 */
import { mkdir, readdir, readFile, rename } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "../observability/logger.ts";
import { fsyncDir, unlinkIfExists, writeFileAtomic } from "./fsync-dir.ts";

/** Where a new subscriber starts. */
export type StartFrom = "earliest" | "latest" | number;

/** The persisted state of one subscriber. */
export interface CursorState {
  v: 1;
  /** Channel or pattern the subscriber reads. */
  pattern: string;
  name: string;
  /** Epoch ms of creation. */
  created: number;
  /** Epoch ms of the last ack or read, for clean-up of forgotten cursors. */
  touched: number;
  /** Where channels without a cursor yet start (for channels that appear later: earliest). */
  from: StartFrom;
  /** Per channel: the next seq to deliver (everything below is acked). */
  cursors: Record<string, number>;
  /** Per channel: messages removed by retention before this subscriber read them. */
  skipped: Record<string, number>;
}

/** Key of a subscriber: pattern and name. */
export function cursorKey(pattern: string, name: string): string {
  return `${pattern}\u0000${name}`;
}

/** File name of a subscriber; `*` and `>` escaped so shells stay friendly. */
export function cursorFileName(pattern: string, name: string): string {
  return `${pattern.replaceAll("*", "%2A").replaceAll(">", "%3E")}~${name}.json`;
}

/** All subscribers' cursors of one data directory, flushed in batches. */
export class CursorStore {
  readonly dir: string;
  private readonly states = new Map<string, CursorState>();
  private readonly dirty = new Set<string>();
  private failedWrites = 0;
  private lastError: string | null = null;
  private readonly logger: Logger;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private readonly flushMs: number;
  private flushing: Promise<void> = Promise.resolve();

  private constructor(dir: string, logger: Logger, flushMs: number) {
    this.dir = dir;
    this.logger = logger;
    this.flushMs = flushMs;
  }

  /**
   * Notes that `key` must be written, and arms the one flush that will write
   * it `flushMs` from now. A store with nothing changed has no timer: an idle
   * board's agent does not wake to find there is nothing to write.
   */
  private markDirty(key: string): void {
    this.dirty.add(key);
    if (this.timer !== null || this.flushMs <= 0) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.flush();
    }, this.flushMs);
    this.timer.unref?.();
  }

  /**
   * A store that keeps cursors in memory only: for federation peers that
   * must leave nothing behind (ephemeral clients get live messages and no
   * replay, and pin nothing in retention). Nothing is ever written.
   */
  static memory(logger: Logger): CursorStore {
    return new CursorStore("", logger, 0);
  }

  /** Loads every cursor file in `dir` (created if missing). */
  static async open(dir: string, logger: Logger, flushMs = 100): Promise<CursorStore> {
    await mkdir(dir, { recursive: true });
    const store = new CursorStore(dir, logger, flushMs);
    for (const f of await readdir(dir)) {
      const path = join(dir, f);
      if (f.endsWith(".tmp")) {
        // A write that never reached its rename: the cursor file beside it is the one that counts.
        await unlinkIfExists(path).catch((err) => logger.warn("could not remove a stale temp file", { file: path, error: String(err) }));
        continue;
      }
      if (!f.endsWith(".json")) continue;
      try {
        const s = JSON.parse(await readFile(path, "utf8")) as CursorState;
        if (typeof s.pattern !== "string" || typeof s.name !== "string" || typeof s.cursors !== "object") {
          throw new Error("missing fields");
        }
        s.skipped ??= {};
        s.touched ??= s.created;
        store.states.set(cursorKey(s.pattern, s.name), s);
      } catch (err) {
        // A cursor file is only ever replaced by rename, so this is outside damage:
        // keep the file for a human and start the subscriber over from its default.
        logger.error("unreadable cursor file set aside", { file: path, error: String(err) });
        await rename(path, path + ".corrupt").catch((e) => logger.error("could not set the unreadable cursor file aside", { file: path, error: String(e) }));
      }
    }
    return store;
  }

  /** Every known subscriber. */
  list(): CursorState[] {
    return [...this.states.values()];
  }

  /** The subscriber `name` on `pattern`, if it exists. */
  get(pattern: string, name: string): CursorState | undefined {
    return this.states.get(cursorKey(pattern, name));
  }

  /** Creates a subscriber (persisted on the next flush). */
  create(pattern: string, name: string, from: StartFrom): CursorState {
    const now = Date.now();
    const s: CursorState = { v: 1, pattern, name, created: now, touched: now, from, cursors: {}, skipped: {} };
    this.states.set(cursorKey(pattern, name), s);
    this.markDirty(cursorKey(pattern, name));
    return s;
  }

  /** Moves a channel cursor; `nextSeq` is the next seq to deliver. */
  set(state: CursorState, channel: string, nextSeq: number): void {
    state.cursors[channel] = nextSeq;
    state.touched = Date.now();
    this.markDirty(cursorKey(state.pattern, state.name));
  }

  /** Marks a subscriber as alive now (a federation peer connected), without moving it. */
  touch(state: CursorState, now = Date.now()): void {
    state.touched = now;
    this.markDirty(cursorKey(state.pattern, state.name));
  }

  /** Counts messages retention removed before the subscriber read them. */
  addSkipped(state: CursorState, channel: string, n: number): void {
    state.skipped[channel] = (state.skipped[channel] ?? 0) + n;
    this.markDirty(cursorKey(state.pattern, state.name));
  }

  /** Removes a subscriber and its file. */
  async delete(pattern: string, name: string): Promise<boolean> {
    const key = cursorKey(pattern, name);
    if (!this.states.delete(key)) return false;
    this.dirty.delete(key);
    await this.flushing;
    if (this.dir === "") return true;
    const path = join(this.dir, cursorFileName(pattern, name));
    try {
      await unlinkIfExists(path);
      await fsyncDir(this.dir);
    } catch (err) {
      // Gone from memory already; the file may come back at the next start as a subscriber to delete again.
      this.failedWrites++;
      this.lastError = String(err);
      this.logger.error("could not remove a deleted subscriber's cursor file", { file: path, error: String(err) });
    }
    return true;
  }

  /** Writes every dirty cursor file now; resolves when they are durable. */
  flush(): Promise<void> {
    this.flushing = this.flushing.then(() => this.flushDirty());
    return this.flushing;
  }

  private async flushDirty(): Promise<void> {
    if (this.dir === "") return this.dirty.clear();
    if (this.dirty.size === 0) return;
    const keys = [...this.dirty];
    this.dirty.clear();
    for (const key of keys) {
      const s = this.states.get(key);
      if (!s) continue;
      const path = join(this.dir, cursorFileName(s.pattern, s.name));
      try {
        // The directory fsync is done once below, for all of them.
        await writeFileAtomic(path, JSON.stringify(s), null);
      } catch (err) {
        this.noteFailure(key, path, err);
      }
    }
    try {
      await fsyncDir(this.dir);
    } catch (err) {
      // The renames may not survive a power cut: write them all again next round.
      for (const key of keys) this.noteFailure(key, this.dir, err);
    }
  }

  /** A cursor that could not be written stays dirty (retried next round), and is counted. */
  private noteFailure(key: string, path: string, err: unknown): void {
    if (!this.states.has(key)) return;
    this.markDirty(key);
    this.failedWrites++;
    this.lastError = String(err);
    this.logger.error("cursor flush failed", { file: path, error: String(err), failed_writes: this.failedWrites });
  }

  /** Cursor writes that failed since open, and how many cursors wait to be written. */
  health(): { failedWrites: number; pending: number; lastError: string | null } {
    return { failedWrites: this.failedWrites, pending: this.dirty.size, lastError: this.lastError };
  }

  /** Flushes and stops the timer. */
  async close(): Promise<void> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    await this.flush();
    // (A failure in that last flush armed a retry; nothing is left to run it.)
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }
}
