/**
 * The federation audit trail (`audit.path`): one JSON object per line for
 * each security-relevant event, rotated by size. Lines are queued and
 * appended in order by one writer, off the hot path; a failing disk loses
 * audit lines (logged once), never a message.
 */
import { appendFile, rename, stat, unlink } from "node:fs/promises";
import type { Logger } from "../observability/logger.ts";

/** Every event the trail records. */
export type AuditEvent =
  | "peer_connected"
  | "peer_disconnected"
  | "peer_rejected"
  | "policy_violation"
  | "loop_dropped"
  | "duplicate_dropped"
  | "malformed_frame";

/** Where and how much to keep. */
export interface AuditOptions {
  path: string;
  maxFileBytes: number;
  maxFiles: number;
  logger: Logger;
}

/** Most lines held while the disk is slow; past it, lines are dropped and counted. */
const MAX_QUEUED = 10_000;

/** An append-only, size-rotated JSON-lines audit file. */
export class AuditLog {
  private readonly opts: AuditOptions;
  private queue: string[] = [];
  private writing: Promise<void> | null = null;
  private size = -1;
  private dropped = 0;
  private failedOnce = false;

  constructor(opts: AuditOptions) {
    this.opts = opts;
  }

  /** Records `event` with its fields (peer, channel, reason, ...). */
  record(event: AuditEvent, fields: Record<string, unknown> = {}): void {
    if (this.queue.length >= MAX_QUEUED) {
      this.dropped++;
      return;
    }
    this.queue.push(JSON.stringify({ time: new Date().toISOString(), event, ...fields }) + "\n");
    this.writing ??= this.drain();
  }

  /** Lines lost: the queue was full, or the file could not be written. */
  get droppedLines(): number {
    return this.dropped;
  }

  private async drain(): Promise<void> {
    try {
      while (this.queue.length > 0) {
        let taken = 0;
        try {
          if (this.size < 0) this.size = await stat(this.opts.path).then((s) => s.size, () => 0);
          // Take the lines that fit in the current file (at least one), rotating first when none do.
          let bytes = Buffer.byteLength(this.queue[0]!);
          if (this.size > 0 && this.size + bytes > this.opts.maxFileBytes) await this.rotate();
          let n = 1;
          while (n < this.queue.length && this.size + bytes + Buffer.byteLength(this.queue[n]!) <= this.opts.maxFileBytes) bytes += Buffer.byteLength(this.queue[n++]!);
          const text = this.queue.slice(0, n).join("");
          this.queue = this.queue.slice(n);
          taken = n;
          await appendFile(this.opts.path, text, { mode: 0o640 });
          this.size += bytes;
        } catch (err) {
          this.dropped += taken + this.queue.length;
          this.queue = [];
          if (!this.failedOnce) this.opts.logger.error("audit trail write failed", { path: this.opts.path, error: String(err) });
          this.failedOnce = true;
        }
      }
    } finally {
      this.writing = null;
    }
  }

  /** path -> path.1 -> ... -> path.<maxFiles-1>; the oldest goes. */
  private async rotate(): Promise<void> {
    const { path, maxFiles } = this.opts;
    await unlink(`${path}.${maxFiles - 1}`).catch(() => {});
    for (let i = maxFiles - 2; i >= 1; i--) await rename(`${path}.${i}`, `${path}.${i + 1}`).catch(() => {});
    if (maxFiles > 1) await rename(path, `${path}.1`).catch(() => {});
    else await unlink(path).catch(() => {});
    this.size = 0;
  }

  /** Resolves once every queued line is written. */
  async flush(): Promise<void> {
    while (this.writing) await this.writing;
  }
}
