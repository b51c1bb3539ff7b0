/**
 * Message ids: UUIDv7 (RFC 9562) in the layout `Bun.randomUUIDv7` gives,
 * a 48-bit millisecond timestamp, the version, a 12-bit counter that rises
 * within a millisecond, the variant and 62 random bits, so that the ids of
 * one origin sort in the order it made them (docs/scale-out.md relies on
 * it). Unlike `Bun.randomUUIDv7`, an id can be written straight into an
 * envelope's bytes as its 36 ASCII characters: a publish whose caller
 * never reads the id (an MQTT client's) makes no string for it.
 *
 * One generator per messenger: the order holds among the ids one
 * generator makes. The random bits come from `crypto.getRandomValues`, a
 * pool at a time.
 */

/** Random bytes fetched at once (8 an id). */
const POOL_BYTES = 4096;

/** `HEX[b]`: the two lowercase hex digits of byte `b`, as char codes in one number (high digit first). */
const HEX = new Uint16Array(256);
for (let b = 0; b < 256; b++) {
  const d = (n: number) => (n < 10 ? 48 + n : 87 + n);
  HEX[b] = (d(b >> 4) << 8) | d(b & 15);
}

const DASH = 0x2d;

/** The length of an id's text. */
export const MESSAGE_ID_CHARS = 36;

export class MessageIds {
  private readonly pool = new Uint8Array(POOL_BYTES);
  private at = POOL_BYTES;
  private lastMs = -1;
  private counter = 0;
  private readonly text = new Uint8Array(MESSAGE_ID_CHARS);
  private readonly latin1 = new TextDecoder("latin1");

  /** `random` fills its argument with random bytes (tests pass their own). */
  constructor(private readonly random: (into: Uint8Array) => void = (into) => crypto.getRandomValues(into)) {}

  /** A new id as a string, for `ms` (Date.now() by default). */
  next(ms: number = Date.now()): string {
    this.write(this.text, 0, ms);
    return this.latin1.decode(this.text);
  }

  /** Writes a new id for `ms` as 36 ASCII bytes into `buf` at `at`. */
  write(buf: Uint8Array, at: number, ms: number): void {
    // A clock that steps back, or 4,096 ids in one millisecond, moves the id's time on instead:
    // ids never go back, and stay within a few ms of the clock under any rate this agent sees.
    if (ms > this.lastMs) {
      this.lastMs = ms;
      // Started in the lower half, so that a millisecond has 2,048 ids or more before it overflows.
      this.counter = this.randomByte() | ((this.randomByte() & 0x07) << 8);
    } else if (++this.counter > 0xfff) {
      this.lastMs++;
      this.counter = 0;
    }
    const t = this.lastMs;
    const hi = Math.floor(t / 0x1000000);
    const lo = t - hi * 0x1000000;
    at = hex(buf, at, (hi >> 16) & 0xff);
    at = hex(buf, at, (hi >> 8) & 0xff);
    at = hex(buf, at, hi & 0xff);
    at = hex(buf, at, lo >> 16);
    buf[at++] = DASH;
    at = hex(buf, at, (lo >> 8) & 0xff);
    at = hex(buf, at, lo & 0xff);
    buf[at++] = DASH;
    at = hex(buf, at, 0x70 | (this.counter >> 8));
    at = hex(buf, at, this.counter & 0xff);
    buf[at++] = DASH;
    if (this.at + 8 > POOL_BYTES) this.refill();
    const p = this.pool;
    let r = this.at;
    at = hex(buf, at, 0x80 | (p[r++]! & 0x3f));
    at = hex(buf, at, p[r++]!);
    buf[at++] = DASH;
    for (let i = 0; i < 6; i++) at = hex(buf, at, p[r++]!);
    this.at = r;
  }

  private randomByte(): number {
    if (this.at >= POOL_BYTES) this.refill();
    return this.pool[this.at++]!;
  }

  private refill(): void {
    this.random(this.pool);
    this.at = 0;
  }
}

function hex(buf: Uint8Array, at: number, b: number): number {
  const h = HEX[b]!;
  buf[at] = h >> 8;
  buf[at + 1] = h & 0xff;
  return at + 2;
}
