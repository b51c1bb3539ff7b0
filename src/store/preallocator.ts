/**
 * Zero-filling the active segment a step ahead of the write position, on
 * the thread pool, so that record writes land on allocated blocks (no
 * allocation, no size change for the fdatasync to carry) and the event loop
 * never waits for a megabyte of zeros.
 */
import type { FileHandle } from "node:fs/promises";
import type { Segment } from "./segment.ts";

/** One megabyte of zeros, shared by every fill (it is only ever read). */
let zeroBlock: Uint8Array | null = null;

/** The zero fill of one channel's active segment. */
export class Preallocator {
  private readonly step: number;
  private readonly segmentBytes: number;
  private running: Promise<void> | null = null;

  /** Fills `step` bytes at a time (0: never), up to `segmentBytes`. */
  constructor(step: number, segmentBytes: number) {
    this.step = step;
    this.segmentBytes = segmentBytes;
  }

  /** Whether `ahead` would start a fill now (checked before building its callbacks). */
  due(seg: Segment, writeEnd: number): boolean {
    return this.step > 0 && this.running === null && writeEnd + this.step / 2 > seg.allocated;
  }

  /** The fill running now, if any (wait for it before cutting or closing the segment). */
  get pending(): Promise<void> | null {
    return this.running;
  }

  /**
   * Starts the next step once `writeEnd` comes within half a step of the
   * allocated end. `applies()` says, when it finishes, whether the result
   * still counts (the same segment, no failure since); if the disk refuses,
   * `cutBack(size)` drops the partial zeros and records extend the file
   * themselves.
   */
  ahead(seg: Segment, fh: FileHandle, writeEnd: number, applies: () => boolean, cutBack: (size: number) => void): void {
    if (this.step <= 0 || this.running) return;
    if (writeEnd + this.step / 2 <= seg.allocated) return;
    const from = seg.allocated;
    const to = Math.min(from + this.step, Math.max(this.segmentBytes, from));
    if (to <= from) return;
    zeroBlock ??= new Uint8Array(1 << 20);
    const zeros = zeroBlock;
    this.running = (async () => {
      try {
        let at = from;
        while (at < to) at += (await fh.write(zeros, 0, Math.min(zeros.length, to - at), at)).bytesWritten;
        if (applies() && seg.allocated === from) seg.allocated = to;
      } catch {
        // No room to preallocate (disk nearly full). Nothing was written past `from` meanwhile:
        // writes wait for a fill they would cross.
        if (applies() && seg.allocated === from) cutBack(from);
      } finally {
        this.running = null;
      }
    })();
  }

  /** Waits for the running fill if a write of `bytes` at `pos` would cross into it: zeros must never land on a record. */
  async beforeWrite(seg: Segment, pos: number, bytes: number): Promise<void> {
    if (this.mustWait(seg, pos, bytes)) await this.running;
  }

  /** Whether a write of `bytes` at `pos` must wait for the fill running now. */
  mustWait(seg: Segment, pos: number, bytes: number): boolean {
    return this.running !== null && pos + bytes > seg.allocated;
  }
}
