/** Byte buffers shared by the store and the wire. */

/**
 * Below this size a fresh zeroed array costs less than an unzeroed one:
 * JSC keeps a small typed array's bytes in its own heap, where a Buffer's
 * come from the allocator with a separate ArrayBuffer object. (Such an
 * array's `.buffer`, and its first `subarray`, are costly: they move the
 * bytes out, several times the cost of making the array. Write into it
 * with the functions below, not through a DataView, and copy a small part
 * out with `slice` rather than viewing it.)
 */
const SMALL_BYTES = 4096;

/**
 * A plain Uint8Array of `n` bytes that are not zeroed first, for buffers
 * whose every byte is written at once (zeroing a fresh megabyte showed in
 * profiles). Plain, not a Buffer: `Buffer#slice` shares memory where
 * `Uint8Array#slice` copies, and callers rely on the copy.
 */
export function uninitialized(n: number): Uint8Array {
  if (n <= SMALL_BYTES) return new Uint8Array(n);
  const b = Buffer.allocUnsafeSlow(n);
  return new Uint8Array(b.buffer, b.byteOffset, n);
}

/**
 * Copies of small chunks, packed into shared blocks. A chunk copied into an
 * array of its own and then viewed (a packet cut out of it, a payload out of
 * the packet) has its bytes moved out of the JavaScript heap into an
 * ArrayBuffer of its own at the first view, and young collections with
 * thousands of those to finalize paused several times longer
 * (docs/benchmarks.md). Views of one block cost no such move. A block lives
 * while any copy in it does; a chunk over a quarter of a block gets an
 * ArrayBuffer of its own, as large ones always had.
 */
export class CopyBlocks {
  private readonly blockBytes: number;
  private block: Buffer = Buffer.alloc(0);
  private at = 0;

  constructor(blockBytes = 16 * 1024) {
    this.blockBytes = blockBytes;
  }

  /** A copy of `chunk` (a Buffer: the MQTT parser wants one), which nobody else writes to. */
  copy(chunk: Uint8Array): Buffer {
    const out = this.alloc(chunk.length);
    out.set(chunk);
    return out;
  }

  /** `n` bytes, not zeroed, for the caller to fill: of a block, or of an ArrayBuffer of their own when large. */
  alloc(n: number): Buffer {
    if (n > this.blockBytes >> 2) return Buffer.allocUnsafeSlow(n);
    if (this.at + n > this.block.length) {
      this.block = Buffer.allocUnsafeSlow(this.blockBytes);
      this.at = 0;
    }
    const out = this.block.subarray(this.at, this.at + n);
    this.at += n;
    return out;
  }
}

/**
 * One buffer reused for bytes that are written out before anything else
 * runs (a batch of records and its positioned write): a write of a few
 * records otherwise allocated an array for them, and one past
 * SMALL_BYTES an ArrayBuffer that a later collection had to finalize.
 */
export class Scratch {
  private readonly max: number;
  private buf: Uint8Array = new Uint8Array(0);

  /** `max`: the largest buffer kept; a larger request gets an array of its own. */
  constructor(max = 1024 * 1024) {
    this.max = max;
  }

  /**
   * At least `n` bytes, not zeroed, valid only until the next call: fill
   * them and write them out before anything else may take the buffer.
   */
  take(n: number): Uint8Array {
    if (n > this.max) return uninitialized(n);
    if (this.buf.length < n) this.buf = uninitialized(Math.min(this.max, Math.max(n, this.buf.length * 2, 4 * SMALL_BYTES)));
    return this.buf;
  }
}

/** Writes `v` (0 .. 0xffff) big-endian at `at`. */
export function setU16BE(b: Uint8Array, at: number, v: number): void {
  b[at] = v >>> 8;
  b[at + 1] = v & 0xff;
}

/** Writes `v` (0 .. 0xffffffff) big-endian at `at`. */
export function setU32BE(b: Uint8Array, at: number, v: number): void {
  b[at] = v >>> 24;
  b[at + 1] = (v >>> 16) & 0xff;
  b[at + 2] = (v >>> 8) & 0xff;
  b[at + 3] = v & 0xff;
}

/** Writes `v` (0 .. 0xffffffff) little-endian at `at`. */
export function setU32LE(b: Uint8Array, at: number, v: number): void {
  b[at] = v & 0xff;
  b[at + 1] = (v >>> 8) & 0xff;
  b[at + 2] = (v >>> 16) & 0xff;
  b[at + 3] = v >>> 24;
}

/** Reads a big-endian u16 at `at`. */
export function getU16BE(b: Uint8Array, at: number): number {
  return (b[at]! << 8) | b[at + 1]!;
}

/** Reads a big-endian u32 at `at`. */
export function getU32BE(b: Uint8Array, at: number): number {
  return b[at]! * 0x100_0000 + ((b[at + 1]! << 16) | (b[at + 2]! << 8) | b[at + 3]!);
}
