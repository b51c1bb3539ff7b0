/**
 * The federation audit trail (`audit.path`): one JSON object per line for
 * each security-relevant event, rotated by size. Lines are queued and
 * appended in order by one writer, off the hot path. A failed append is cut
 * back to the last whole line and tried again with backoff, the lines kept
 * in the queue; only lines past MAX_QUEUED are dropped (and counted). A
 * failing disk never costs a message.
 */
import { open, rename, stat } from "node:fs/promises";
import type { Logger } from "../observability/logger.ts";
import { unlinkIfExists } from "../store/fsync-dir.ts";

/** Every event the trail records. */
export type AuditEvent =
  | "peer_connected"
  | "peer_disconnected"
  | "peer_rejected"
  | "policy_violation"
  | "loop_dropped"
  | "duplicate_dropped"
  | "malformed_frame"
  | "position_expired"
  | "link_stalled"
  | "reconfigured";

/** Where and how much to keep. */
export interface AuditOptions {
  path: string;
  maxFileBytes: number;
  maxFiles: number;
  logger: Logger;
}

/** Events kept in memory for the dashboard. */
const RECENT = 500;
/** Most lines held while the disk is slow or failing; past it, lines are dropped and counted. */
const MAX_QUEUED = 10_000;
/** Backoff between attempts after a failed write (ms). */
const RETRY_FIRST_MS = 100;
const RETRY_MAX_MS = 5_000;

/** An append-only, size-rotated JSON-lines audit file. */
export class AuditLog {
  private readonly opts: AuditOptions;
  private queue: string[] = [];
  private readonly recentLines: Record<string, unknown>[] = [];
  private writing: Promise<void> | null = null;
  private size = -1;
  private dropped = 0;
  private failedWrites = 0;
  private retryAttempt = 0;
  private retryTimer: ReturnType<typeof setTimeout> | null = null;
  private retried: (() => void) | null = null;

  constructor(opts: AuditOptions) {
    this.opts = opts;
  }

  /** Records `event` with its fields (peer, channel, reason, ...). */
  record(event: AuditEvent, fields: Record<string, unknown> = {}): void {
    const line = { time: new Date().toISOString(), event, ...fields };
    this.recentLines.push(line);
    if (this.recentLines.length > RECENT) this.recentLines.splice(0, this.recentLines.length - RECENT);
    if (this.queue.length >= MAX_QUEUED) {
      this.dropped++;
      return;
    }
    this.queue.push(JSON.stringify(line) + "\n");
    if (!this.retryTimer) this.writing ??= this.drain();
  }

  /** The latest events, oldest first (the dashboard's list; the file has them all). */
  recent(): readonly Record<string, unknown>[] {
    return this.recentLines;
  }

  /** Lines lost because the queue was full (the disk failing or slow for long). */
  get droppedLines(): number {
    return this.dropped;
  }

  /** Appends (or rotations) that failed and were tried again. */
  get failedWriteCount(): number {
    return this.failedWrites;
  }

  private async drain(): Promise<void> {
    try {
      while (this.queue.length > 0) {
        if (this.size < 0)
          this.size = await stat(this.opts.path).then(
            (st) => st.size,
            () => 0,
          );
        // Take the lines that fit in the current file (at least one), rotating first when none do.
        let bytes = Buffer.byteLength(this.queue[0]!);
        let n = 1;
        try {
          if (this.size > 0 && this.size + bytes > this.opts.maxFileBytes) await this.rotate();
          while (n < this.queue.length && this.size + bytes + Buffer.byteLength(this.queue[n]!) <= this.opts.maxFileBytes) bytes += Buffer.byteLength(this.queue[n++]!);
          await this.append(this.queue.slice(0, n).join(""));
        } catch (err) {
          this.failedWrites++;
          this.opts.logger.error("audit trail write failed, retrying", { path: this.opts.path, error: String(err), queued: this.queue.length, attempt: this.retryAttempt });
          this.size = -1; // stat again: the cut back may not have happened
          await this.backoff();
          continue;
        }
        this.queue = this.queue.slice(n);
        this.size += bytes;
        if (this.retryAttempt > 0) this.opts.logger.warn("audit trail written again", { path: this.opts.path, attempts: this.retryAttempt });
        this.retryAttempt = 0;
      }
    } finally {
      this.writing = null;
    }
  }

  /** Appends `text` whole, or cuts the file back to where it was and throws. */
  private async append(text: string): Promise<void> {
    const fh = await open(this.opts.path, "a", 0o640);
    try {
      const at = (await fh.stat()).size;
      try {
        await fh.write(text);
      } catch (err) {
        // Never half a line: a torn line would be read as a forged or broken event.
        await fh.truncate(at).catch((e) => this.opts.logger.error("could not cut back a failed audit append", { path: this.opts.path, error: String(e) }));
        throw err;
      }
    } finally {
      await fh.close();
    }
  }

  private backoff(): Promise<void> {
    const ms = Math.min(RETRY_MAX_MS, RETRY_FIRST_MS * 2 ** this.retryAttempt);
    this.retryAttempt++;
    return new Promise<void>((resolve) => {
      this.retried = resolve;
      this.retryTimer = setTimeout(() => {
        this.retryTimer = null;
        this.retried = null;
        resolve();
      }, ms);
      this.retryTimer.unref?.();
    });
  }

  /** path -> path.1 -> ... -> path.<maxFiles-1>; the oldest goes. */
  private async rotate(): Promise<void> {
    const { path, maxFiles } = this.opts;
    await unlinkIfExists(`${path}.${maxFiles - 1}`);
    // Files of the older rotations may be missing (fewer rotations so far): only those are skipped.
    for (let i = maxFiles - 2; i >= 1; i--) await renameIfExists(`${path}.${i}`, `${path}.${i + 1}`);
    if (maxFiles > 1) await renameIfExists(path, `${path}.1`);
    else await unlinkIfExists(path);
    this.size = 0;
  }

  /**
   * Resolves once every queued line is written, or after `withinMs` while
   * the disk keeps failing (a waiting retry is run at once, once), so that a stop
   * is never held up by a broken disk.
   */
  async flush(withinMs = 2_000): Promise<void> {
    const until = Date.now() + withinMs;
    let kicked = false;
    while (this.writing && Date.now() < until) {
      if (!kicked && this.retryTimer) {
        kicked = true;
        clearTimeout(this.retryTimer);
        this.retryTimer = null;
        this.retried?.();
      }
      await Promise.race([this.writing, Bun.sleep(Math.max(1, Math.min(50, until - Date.now())))]);
    }
  }

  /** Stops retrying; what is still queued is dropped (and counted). */
  close(): void {
    this.dropped += this.queue.length;
    this.queue = [];
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.retryTimer = null;
    this.retried?.();
  }
}

async function renameIfExists(from: string, to: string): Promise<void> {
  try {
    await rename(from, to);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
}
