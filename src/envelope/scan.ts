/**
 * Reading and amending a stored envelope without decoding it.
 *
 * Forwarding touches every record twice per hop: the sender needs its route
 * (never send a record to a peer already in it) and the receiver checks it
 * and appends its own name. Decoding the whole msgpack map for that, payload
 * included, and encoding it again was most of a hub's CPU when it forwarded
 * a backlog. `scanEnvelope` walks the map once, validates its structure
 * (every byte accounted for, keys are strings, no reserved bytes, no unknown
 * extension types, bounded nesting) and decodes only the fields it needs;
 * `withRoute` splices one more name into the route and leaves every other
 * byte as the publisher wrote it.
 */
import { InvalidArgumentError } from "../errors.ts";

/** The fields a forwarder and a receiver look at, and where the route sits. */
export interface EnvelopeView {
  id: string;
  channel: string;
  route: string[];
  /** Byte offset of the route array's header, and of the first byte after the array. */
  routeStart: number;
  routeEnd: number;
  /** Byte offset of the first route element (after the array header). */
  routeItems: number;
}

/** Deepest nesting accepted inside a payload (arrays and maps). */
const MAX_DEPTH = 64;


/** The keys the scan reads or checks, by index. */
const KEYS = ["id", "channel", "origin", "type", "route"].map((k) => new TextEncoder().encode(k));
const ID = 0;
const CHANNEL = 1;
const ORIGIN = 2;
const TYPE = 3;
const ROUTE = 4;

class Scanner {
  pos = 0;
  private text: Buffer | undefined;
  readonly view: DataView;
  constructor(readonly buf: Uint8Array) {
    this.view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  }

  need(n: number): void {
    if (this.pos + n > this.buf.length) throw new InvalidArgumentError("envelope is truncated");
  }

  u8(): number {
    this.need(1);
    return this.buf[this.pos++]!;
  }

  u16(): number {
    this.need(2);
    const v = this.view.getUint16(this.pos);
    this.pos += 2;
    return v;
  }

  u32(): number {
    this.need(4);
    const v = this.view.getUint32(this.pos);
    this.pos += 4;
    return v;
  }

  /** Length of a string at pos, or -1 if the next value is not a string; consumes the header. */
  strLen(): number {
    const b = this.u8();
    if ((b & 0xe0) === 0xa0) return b & 0x1f;
    if (b === 0xd9) return this.u8();
    if (b === 0xda) return this.u16();
    if (b === 0xdb) return this.u32();
    this.pos--;
    return -1;
  }

  str(what: string): string {
    const n = this.strLen();
    if (n < 0) throw new InvalidArgumentError(`envelope field ${what} is not a string`);
    this.need(n);
    const start = this.pos;
    this.pos += n;
    // Straight from the bytes: a subarray plus TextDecoder per field cost more than the rest of the scan.
    this.text ??= Buffer.from(this.buf.buffer, this.buf.byteOffset, this.buf.byteLength);
    return this.text.toString("utf8", start, this.pos);
  }

  /** Index in KEYS of the key at pos (-1 for another key), without making a string of it. */
  key(): number {
    const n = this.strLen();
    if (n < 0) throw new InvalidArgumentError("envelope has a key that is not a string");
    this.need(n);
    const start = this.pos;
    this.pos += n;
    next: for (let k = 0; k < KEYS.length; k++) {
      const key = KEYS[k]!;
      if (key.length !== n) continue;
      for (let i = 0; i < n; i++) if (this.buf[start + i] !== key[i]) continue next;
      return k;
    }
    return -1;
  }

  /** Length of an array at pos, or -1; consumes the header. */
  arrayLen(): number {
    const b = this.u8();
    if ((b & 0xf0) === 0x90) return b & 0x0f;
    if (b === 0xdc) return this.u16();
    if (b === 0xdd) return this.u32();
    this.pos--;
    return -1;
  }

  /** Skips one complete value, checking its structure. */
  skip(depth: number): void {
    if (depth > MAX_DEPTH) throw new InvalidArgumentError("envelope nests too deeply");
    const b = this.u8();
    if (b <= 0x7f || b >= 0xe0 || b === 0xc0 || b === 0xc2 || b === 0xc3) return;
    if ((b & 0xe0) === 0xa0) return this.bytes(b & 0x1f);
    if ((b & 0xf0) === 0x90) return this.items(b & 0x0f, depth);
    if ((b & 0xf0) === 0x80) return this.items(2 * (b & 0x0f), depth);
    switch (b) {
      case 0xcc:
      case 0xd0:
        return this.bytes(1);
      case 0xcd:
      case 0xd1:
        return this.bytes(2);
      case 0xce:
      case 0xd2:
      case 0xca:
        return this.bytes(4);
      case 0xcf:
      case 0xd3:
      case 0xcb:
        return this.bytes(8);
      case 0xd9:
      case 0xc4:
        return this.bytes(this.u8());
      case 0xda:
      case 0xc5:
        return this.bytes(this.u16());
      case 0xdb:
      case 0xc6:
        return this.bytes(this.u32());
      case 0xdc:
        return this.items(this.u16(), depth);
      case 0xdd:
        return this.items(this.u32(), depth);
      case 0xde:
        return this.items(2 * this.u16(), depth);
      case 0xdf:
        return this.items(2 * this.u32(), depth);
      // Extensions: only the timestamp (type -1), the one every msgpack library reads.
      case 0xd6:
        return this.ext(4);
      case 0xd7:
        return this.ext(8);
      case 0xc7:
        return this.ext(this.u8());
      default:
        throw new InvalidArgumentError(`envelope holds msgpack byte 0x${b.toString(16)}, which keyop does not store`);
    }
  }

  private bytes(n: number): void {
    this.need(n);
    this.pos += n;
  }

  private items(n: number, depth: number): void {
    // Every item takes at least one byte: a count beyond what is left is a lie, not work to do.
    this.need(n);
    for (let i = 0; i < n; i++) this.skip(depth + 1);
  }

  private ext(n: number): void {
    const type = this.u8();
    if (type !== 0xff || (n !== 4 && n !== 8 && n !== 12)) throw new InvalidArgumentError("envelope holds a msgpack extension other than a timestamp");
    this.bytes(n);
  }
}

/**
 * Walks a stored body: a msgpack map with string keys whose `id` and
 * `channel` are strings and whose `route` is a list of strings (absent is
 * an empty route only if there is no route key at all; then it cannot be
 * amended and the record is refused). Throws InvalidArgumentError on
 * anything else, including trailing bytes.
 */
export function scanEnvelope(body: Uint8Array): EnvelopeView {
  const s = new Scanner(body);
  const head = s.u8();
  let n: number;
  if ((head & 0xf0) === 0x80) n = head & 0x0f;
  else if (head === 0xde) n = s.u16();
  else if (head === 0xdf) n = s.u32();
  else throw new InvalidArgumentError("envelope is not a msgpack map");
  s.need(n);
  let id: string | undefined;
  let channel: string | undefined;
  let route: string[] | undefined;
  let routeStart = -1;
  let routeItems = -1;
  let routeEnd = -1;
  let seen = 0;
  for (let i = 0; i < n; i++) {
    const key = s.key();
    if (key >= 0) {
      // A second value for a field keyop reads could make two readers see two different envelopes.
      if (seen & (1 << key)) throw new InvalidArgumentError(`envelope has the key ${new TextDecoder().decode(KEYS[key])} twice`);
      seen |= 1 << key;
    }
    if (key === ID) id = s.str("id");
    else if (key === CHANNEL) channel = s.str("channel");
    else if (key === ORIGIN || key === TYPE) {
      const len = s.strLen();
      if (len < 0) throw new InvalidArgumentError("envelope field origin or type is not a string");
      s.need(len);
      s.pos += len;
    } else if (key === ROUTE) {
      routeStart = s.pos;
      const len = s.arrayLen();
      if (len < 0) throw new InvalidArgumentError("envelope field route is not a list");
      s.need(len);
      routeItems = s.pos;
      route = [];
      for (let k = 0; k < len; k++) route.push(s.str("route entry"));
      routeEnd = s.pos;
    } else s.skip(1);
  }
  if (s.pos !== body.length) throw new InvalidArgumentError("envelope has trailing bytes");
  if (id === undefined || channel === undefined || route === undefined) throw new InvalidArgumentError("envelope lacks id, channel or route");
  return { id, channel, route, routeStart, routeEnd, routeItems };
}

/**
 * A copy of `body` whose route has one more entry, `entry` (from
 * `routeEntry`, made once per batch); every other byte is kept.
 */
export function withRoute(body: Uint8Array, view: EnvelopeView, entry: Uint8Array): Uint8Array {
  const count = view.route.length + 1;
  const headerLen = count <= 15 ? 1 : count <= 0xffff ? 3 : 5;
  const out = new Uint8Array(body.length - (view.routeItems - view.routeStart) + headerLen + entry.length);
  let at = copy(out, 0, body, 0, view.routeStart);
  if (headerLen === 1) out[at++] = 0x90 | count;
  else if (headerLen === 3) {
    out[at++] = 0xdc;
    out[at++] = count >> 8;
    out[at++] = count & 0xff;
  } else {
    out[at++] = 0xdd;
    out[at++] = count >>> 24;
    out[at++] = (count >> 16) & 0xff;
    out[at++] = (count >> 8) & 0xff;
    out[at++] = count & 0xff;
  }
  at = copy(out, at, body, view.routeItems, view.routeEnd);
  at = copy(out, at, entry, 0, entry.length);
  copy(out, at, body, view.routeEnd, body.length);
  return out;
}

/** Copies src[from, to) to dst at `at`; returns the end. Short spans by hand: `set` has a high fixed cost. */
function copy(dst: Uint8Array, at: number, src: Uint8Array, from: number, to: number): number {
  if (to - from < 32) {
    for (let i = from; i < to; i++) dst[at++] = src[i]!;
    return at;
  }
  dst.set(src.subarray(from, to), at);
  return at + (to - from);
}

/** `name` as the msgpack string `withRoute` appends. */
export function routeEntry(name: string): Uint8Array {
  const bytes = new TextEncoder().encode(name);
  const len = bytes.length;
  const head = len <= 31 ? [0xa0 | len] : len <= 0xff ? [0xd9, len] : len <= 0xffff ? [0xda, len >> 8, len & 0xff] : null;
  if (!head) throw new InvalidArgumentError("instance name too long for a route");
  return new Uint8Array([...head, ...bytes]);
}
