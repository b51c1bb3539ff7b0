/**
 * A reader for the frame bodies on the message path (BATCH, ACK, PING):
 * a msgpack map with short ASCII keys whose values are numbers (unsigned
 * integers, float64), ASCII strings, booleans, nil, binaries, or flat arrays
 * of those. It returns what the general decoder (msgpackr, as frame.ts
 * configures it) returns for the same bytes, binaries as views of them, or
 * null for anything else or any doubt (then the caller uses the general
 * decoder). The general decoder creates a DataView and looks up every key in
 * its string cache per frame; one BATCH or ACK per message made that a
 * visible part of a hop's CPU.
 */

/** Most keys and array items the fast path takes before leaving it to the general decoder. */
const MAX_ITEMS = 1 << 20;

class Reader {
  pos = 0;
  constructor(readonly b: Uint8Array) {}
}

/** `b` as a plain object, or null when the fast path does not apply. */
export function readSimpleMap(b: Uint8Array): Record<string, unknown> | null {
  const r = new Reader(b);
  const n = mapHeader(r);
  if (n < 0) return null;
  const out: Record<string, unknown> = {};
  for (let i = 0; i < n; i++) {
    const key = value(r, false);
    if (typeof key !== "string" || key === "__proto__") return null;
    const v = value(r, true);
    if (v === NOPE) return null;
    out[key] = v;
  }
  return r.pos === b.length ? out : null;
}

const scratch = new Uint8Array(8);
const scratchView = new DataView(scratch.buffer);

/** What `value` returns when the fast path does not apply. */
const NOPE = Symbol("not simple");

function mapHeader(r: Reader): number {
  const { b } = r;
  if (r.pos >= b.length) return -1;
  const t = b[r.pos++]!;
  if (t >= 0x80 && t <= 0x8f) return t & 0x0f;
  if (t === 0xde) return u16(r);
  return -1;
}

function u16(r: Reader): number {
  const { b } = r;
  if (r.pos + 2 > b.length) return -1;
  const v = (b[r.pos]! << 8) | b[r.pos + 1]!;
  r.pos += 2;
  return v;
}

function u32(r: Reader): number {
  const { b } = r;
  if (r.pos + 4 > b.length) return -1;
  const v = b[r.pos]! * 0x100_0000 + ((b[r.pos + 1]! << 16) | (b[r.pos + 2]! << 8) | b[r.pos + 3]!);
  r.pos += 4;
  return v;
}

/** Latin-1 is ASCII for the bytes `ascii` lets through: one native call for the whole string. */
const latin1Slice = (Buffer.prototype as unknown as { latin1Slice(this: Uint8Array, start: number, end: number): string }).latin1Slice;

function ascii(r: Reader, len: number): string | typeof NOPE {
  const { b } = r;
  if (len < 0 || r.pos + len > b.length) return NOPE;
  const end = r.pos + len;
  for (let i = r.pos; i < end; i++) if (b[i]! >= 0x80) return NOPE;
  // A key of one letter is a string JSC keeps already; a longer string (a channel) built a char
  // at a time is a rope, flattened again by the first lookup.
  const s = len === 1 ? String.fromCharCode(b[r.pos]!) : latin1Slice.call(b, r.pos, end);
  r.pos = end;
  return s;
}

function bin(r: Reader, len: number): Uint8Array | typeof NOPE {
  if (len < 0 || r.pos + len > r.b.length) return NOPE;
  const v = r.b.subarray(r.pos, r.pos + len);
  r.pos += len;
  return v;
}

/** One value; arrays only when `arrays` (and then of scalars only). */
function value(r: Reader, arrays: boolean): unknown {
  const { b } = r;
  if (r.pos >= b.length) return NOPE;
  const t = b[r.pos++]!;
  if (t < 0x80) return t;
  if (t >= 0xa0 && t <= 0xbf) return ascii(r, t & 0x1f);
  if (t >= 0x90 && t <= 0x9f) return arrays ? items(r, t & 0x0f) : NOPE;
  switch (t) {
    case 0xc0:
      return null;
    case 0xc2:
      return false;
    case 0xc3:
      return true;
    case 0xcc:
      if (r.pos + 1 > b.length) return NOPE;
      return b[r.pos++]!;
    case 0xcd: {
      const v = u16(r);
      return v < 0 ? NOPE : v;
    }
    case 0xce: {
      const v = u32(r);
      return v < 0 ? NOPE : v;
    }
    case 0xcf: {
      const hi = u32(r);
      const lo = u32(r);
      return hi < 0 || lo < 0 ? NOPE : hi * 0x1_0000_0000 + lo;
    }
    case 0xcb: {
      if (r.pos + 8 > b.length) return NOPE;
      // Copied into a scratch buffer: a DataView over `b` is what this reader exists to avoid.
      for (let i = 0; i < 8; i++) scratch[i] = b[r.pos + i]!;
      r.pos += 8;
      return scratchView.getFloat64(0);
    }
    case 0xd9:
      if (r.pos + 1 > b.length) return NOPE;
      return ascii(r, b[r.pos++]!);
    case 0xda:
      return ascii(r, u16(r));
    case 0xdb:
      return ascii(r, u32(r));
    case 0xc4:
      if (r.pos + 1 > b.length) return NOPE;
      return bin(r, b[r.pos++]!);
    case 0xc5:
      return bin(r, u16(r));
    case 0xc6:
      return bin(r, u32(r));
    case 0xdc:
      return arrays ? items(r, u16(r)) : NOPE;
    case 0xdd:
      return arrays ? items(r, u32(r)) : NOPE;
    default:
      return NOPE;
  }
}

function items(r: Reader, n: number): unknown[] | typeof NOPE {
  // Each item takes at least one byte: a count above what is left is not this reader's to judge.
  if (n < 0 || n > MAX_ITEMS || n > r.b.length - r.pos) return NOPE;
  const out: unknown[] = [];
  for (let i = 0; i < n; i++) {
    const v = value(r, false);
    if (v === NOPE) return NOPE;
    out.push(v);
  }
  return out;
}
