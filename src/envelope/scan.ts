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

/**
 * Where the routing fields of an envelope sit in its bytes. Nothing is
 * decoded until asked for (`envelopeId`, `routeNames`): a forwarder only
 * compares route bytes, a receiver decodes the id alone.
 */
export interface EnvelopeView {
  /** Byte range of the id string's content. */
  idStart: number;
  idEnd: number;
  /** Byte range of the channel string's content. */
  channelStart: number;
  channelEnd: number;
  /** Byte offset of the route array's header, of its first element, and of the first byte after it. */
  routeStart: number;
  routeItems: number;
  routeEnd: number;
  routeCount: number;
  /** Byte range of the payload value (msgpack header included). */
  payloadStart: number;
  payloadEnd: number;
  /** The body holds MessageMeta fields other than the two below (expires, headers, ...): decode it to read them. */
  hasMeta: boolean;
  /** Byte range of the publisher string's content (-1: none). */
  publisherStart: number;
  publisherEnd: number;
  /** The QoS it was published with over MQTT (-1: none given). */
  qos: number;
  /** When it expires, epoch ms (0: never). */
  expires: number;
  /** Byte range of the reply_to string's content (-1: not a request). */
  replyToStart: number;
  replyToEnd: number;
}

/** Deepest nesting accepted inside a payload (arrays and maps). */
const MAX_DEPTH = 64;

/** The keys the scan reads or checks, by index. */
const KEYS = ["id", "channel", "origin", "type", "route", "payload", "publisher", "qos"].map((k) => new TextEncoder().encode(k));
const ID = 0;
const CHANNEL = 1;
const ORIGIN = 2;
const TYPE = 3;
const ROUTE = 4;
const PAYLOAD = 5;
const PUBLISHER = 6;
const QOS = 7;
/**
 * The other MessageMeta keys (src/envelope/envelope.ts): their presence is
 * noted, their values skipped. Publisher and QoS, which every MQTT publish
 * carries and every MQTT delivery checks, are read by the scan itself.
 */
const META = ["expires", "content_type", "reply_to", "correlation_data", "headers", "utf8", "retain"].map((k) => new TextEncoder().encode(k));
/** What `key()` returns for one of META. */
const META_KEY = -2;
/** What `key()` returns for `expires`, a META key the scan reads (readers skip what expired). */
const EXPIRES_KEY = -3;
/** What `key()` returns for `reply_to`, a META key the scan reads (federation routes replies by it). */
const REPLY_TO_KEY = -4;

class Scanner {
  pos = 0;
  constructor(readonly buf: Uint8Array) {}

  need(n: number): void {
    if (this.pos + n > this.buf.length) throw new InvalidArgumentError("envelope is truncated");
  }

  u8(): number {
    this.need(1);
    return this.buf[this.pos++]!;
  }

  u16(): number {
    this.need(2);
    const b = this.buf;
    const v = (b[this.pos]! << 8) | b[this.pos + 1]!;
    this.pos += 2;
    return v;
  }

  u32(): number {
    this.need(4);
    const b = this.buf;
    const v = b[this.pos]! * 0x1000000 + ((b[this.pos + 1]! << 16) | (b[this.pos + 2]! << 8) | b[this.pos + 3]!);
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

  /** Skips a string, returning the start of its content; throws if the next value is not a string. */
  strContent(what: string): number {
    const n = this.strLen();
    if (n < 0) throw new InvalidArgumentError(`envelope field ${what} is not a string`);
    this.need(n);
    const start = this.pos;
    this.pos += n;
    return start;
  }

  /** Index in KEYS of the key at pos (META_KEY for a meta key, -1 for another), without making a string of it. */
  key(): number {
    const n = this.strLen();
    if (n < 0) throw new InvalidArgumentError("envelope has a key that is not a string");
    this.need(n);
    const start = this.pos;
    this.pos += n;
    const k = this.find(KEYS, start, n);
    if (k >= 0) return k;
    const m = this.find(META, start, n);
    return m === 0 ? EXPIRES_KEY : m === 2 ? REPLY_TO_KEY : m > 0 ? META_KEY : -1;
  }

  private find(keys: Uint8Array[], start: number, n: number): number {
    next: for (let k = 0; k < keys.length; k++) {
      const key = keys[k]!;
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
 * Walks a stored body: a msgpack map with string keys whose `id`,
 * `channel`, `origin` and `type` are strings and whose `route` is a list of
 * strings (a body without a route cannot be amended and is refused).
 * Throws InvalidArgumentError on anything else, including trailing bytes.
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
  const v: EnvelopeView = {
    idStart: -1,
    idEnd: -1,
    channelStart: -1,
    channelEnd: -1,
    routeStart: -1,
    routeItems: -1,
    routeEnd: -1,
    routeCount: 0,
    payloadStart: -1,
    payloadEnd: -1,
    hasMeta: false,
    publisherStart: -1,
    publisherEnd: -1,
    qos: -1,
    expires: 0,
    replyToStart: -1,
    replyToEnd: -1,
  };
  let seen = 0;
  for (let i = 0; i < n; i++) {
    const key = s.key();
    if (key >= 0) {
      // A second value for a field keyop reads could make two readers see two different envelopes.
      if (seen & (1 << key)) throw new InvalidArgumentError(`envelope has the key ${new TextDecoder().decode(KEYS[key])} twice`);
      seen |= 1 << key;
    }
    if (key === ID) {
      v.idStart = s.strContent("id");
      v.idEnd = s.pos;
    } else if (key === CHANNEL) {
      v.channelStart = s.strContent("channel");
      v.channelEnd = s.pos;
    } else if (key === ORIGIN || key === TYPE) s.strContent(key === ORIGIN ? "origin" : "type");
    else if (key === ROUTE) {
      v.routeStart = s.pos;
      const len = s.arrayLen();
      if (len < 0) throw new InvalidArgumentError("envelope field route is not a list");
      s.need(len);
      v.routeItems = s.pos;
      for (let k = 0; k < len; k++) s.strContent("route entry");
      v.routeEnd = s.pos;
      v.routeCount = len;
    } else if (key === PUBLISHER || key === QOS) {
      // Optional fields: one of another type is skipped like an unknown key (readers leave it out).
      const at = s.pos;
      s.skip(1);
      const b = body[at]!;
      if (key === QOS && b <= 2) v.qos = b;
      if (key === PUBLISHER && s.pos > at) {
        const r = new Scanner(body);
        r.pos = at;
        const n = r.strLen();
        if (n >= 0) {
          v.publisherStart = r.pos;
          v.publisherEnd = r.pos + n;
        }
      }
    } else if (key === PAYLOAD) {
      v.payloadStart = s.pos;
      s.skip(1);
      v.payloadEnd = s.pos;
    } else if (key === REPLY_TO_KEY) {
      v.hasMeta = true;
      const at = s.pos;
      s.skip(1);
      const r = new Scanner(body);
      r.pos = at;
      const n = r.strLen();
      if (n >= 0) {
        v.replyToStart = r.pos;
        v.replyToEnd = r.pos + n;
      }
    } else if (key === EXPIRES_KEY) {
      v.hasMeta = true;
      const at = s.pos;
      s.skip(1);
      v.expires = timeValue(body, at);
    } else {
      if (key === META_KEY) v.hasMeta = true;
      s.skip(1);
    }
  }
  if (s.pos !== body.length) throw new InvalidArgumentError("envelope has trailing bytes");
  if (v.idStart < 0 || v.channelStart < 0 || v.routeStart < 0) throw new InvalidArgumentError("envelope lacks id, channel or route");
  return v;
}

/** A positive integer (or float) time at `at`, as msgpack libraries write one; 0 for anything else. */
function timeValue(b: Uint8Array, at: number): number {
  const t = b[at]!;
  const dv = new DataView(b.buffer, b.byteOffset + at + 1);
  let v = 0;
  if (t <= 0x7f) v = t;
  else if (t === 0xcc) v = dv.getUint8(0);
  else if (t === 0xcd) v = dv.getUint16(0);
  else if (t === 0xce) v = dv.getUint32(0);
  else if (t === 0xcf || t === 0xd3) v = dv.getUint32(0) * 0x1_0000_0000 + dv.getUint32(4);
  else if (t === 0xcb) v = dv.getFloat64(0);
  else if (t === 0xca) v = dv.getFloat32(0);
  else if (t === 0xd2) v = dv.getInt32(0);
  return Number.isFinite(v) && v > 0 ? v : 0;
}

/** The request's reply_to (its inbox), or undefined for a message that is not a request. */
export function envelopeReplyTo(body: Uint8Array, v: EnvelopeView): string | undefined {
  return v.replyToStart < 0 ? undefined : new TextDecoder().decode(body.subarray(v.replyToStart, v.replyToEnd));
}

/** Whether the envelope has expired at `now` (epoch ms). */
export function isExpired(v: EnvelopeView, now: number): boolean {
  return v.expires > 0 && v.expires <= now;
}

const utf8 = new TextDecoder();

/** The envelope's id. */
export function envelopeId(body: Uint8Array, v: EnvelopeView): string {
  return utf8.decode(body.subarray(v.idStart, v.idEnd));
}

/** The envelope's channel. */
export function envelopeChannel(body: Uint8Array, v: EnvelopeView): string {
  return utf8.decode(body.subarray(v.channelStart, v.channelEnd));
}

/** True if the channel's UTF-8 bytes are `name` (from `utf8Bytes`). */
export function channelIs(body: Uint8Array, v: EnvelopeView, name: Uint8Array): boolean {
  return sameBytes(body, v.channelStart, v.channelEnd, name);
}

/** True if the publisher's UTF-8 bytes are `name` (from `utf8Bytes`); false without a publisher. */
export function publisherIs(body: Uint8Array, v: EnvelopeView, name: Uint8Array): boolean {
  return v.publisherStart >= 0 && sameBytes(body, v.publisherStart, v.publisherEnd, name);
}

/** The route's names. */
export function routeNames(body: Uint8Array, v: EnvelopeView): string[] {
  const out: string[] = [];
  const s = new Scanner(body);
  s.pos = v.routeItems;
  for (let k = 0; k < v.routeCount; k++) {
    const start = s.strContent("route entry");
    out.push(utf8.decode(body.subarray(start, s.pos)));
  }
  return out;
}

/** True if `name` (its UTF-8 bytes) is in the route, whatever string form each entry was written in. */
export function routeIncludes(body: Uint8Array, v: EnvelopeView, name: Uint8Array): boolean {
  const s = new Scanner(body);
  s.pos = v.routeItems;
  for (let k = 0; k < v.routeCount; k++) {
    const start = s.strContent("route entry");
    if (sameBytes(body, start, s.pos, name)) return true;
  }
  return false;
}

function sameBytes(body: Uint8Array, start: number, end: number, name: Uint8Array): boolean {
  if (end - start !== name.length) return false;
  for (let i = 0; i < name.length; i++) if (body[start + i] !== name[i]) return false;
  return true;
}

const nameEncoder = new TextEncoder();
/** Names seen lately and their bytes: a link's few channels and peers come back with every batch. */
const nameCache = new Map<string, Uint8Array>();
const NAME_CACHE_MAX = 4096;

/**
 * UTF-8 bytes of a name, for `channelIs`, `routeIncludes` and the frames.
 * Shared between callers: read it, never write into it.
 */
export function utf8Bytes(name: string): Uint8Array {
  let b = nameCache.get(name);
  if (b === undefined) {
    if (nameCache.size >= NAME_CACHE_MAX) nameCache.clear();
    b = nameEncoder.encode(name);
    nameCache.set(name, b);
  }
  return b;
}

/**
 * A copy of `body` whose route has one more entry, `entry` (from
 * `routeEntry`, made once per batch); every other byte is kept.
 */
export function withRoute(body: Uint8Array, view: EnvelopeView, entry: Uint8Array): Uint8Array {
  const count = view.routeCount + 1;
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
