/**
 * The file the ingest floors write (bench/ingest-floor.ts, bench/http-floor.ts):
 * zero-filled and fdatasynced once, then written round and round, so that no
 * commit changes its size and an fdatasync flushes only the data.
 */
import { fdatasyncSync, openSync, writeSync } from "node:fs";

/** Large enough that one commit never wraps inside its write. */
const RING_BYTES = 64 * 1024 * 1024;

export class RingFile {
  readonly fd: number;
  private pos = 0;

  constructor(path: string) {
    this.fd = openSync(path, "w+");
    const zeros = new Uint8Array(1024 * 1024);
    for (let at = 0; at < RING_BYTES; at += zeros.length) writeSync(this.fd, zeros, 0, zeros.length, at);
    fdatasyncSync(this.fd);
  }

  /** `parts` in one positioned write, after what was written before (not yet durable). */
  write(parts: readonly Uint8Array[]): void {
    let size = 0;
    for (const p of parts) size += p.length;
    const buf = new Uint8Array(size);
    let off = 0;
    for (const p of parts) {
      buf.set(p, off);
      off += p.length;
    }
    if (this.pos + size > RING_BYTES) this.pos = 0;
    writeSync(this.fd, buf, 0, size, this.pos);
    this.pos += size;
  }

  /** fdatasync on this thread. */
  sync(): void {
    fdatasyncSync(this.fd);
  }
}
