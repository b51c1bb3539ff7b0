/**
 * An envelope's msgpack written by hand: byte for byte what msgpackr writes
 * for the same snake_case map (the tests compare the two on random
 * envelopes), without building that map first and without msgpackr's
 * shared 8 KiB slabs, one of which was allocated every twenty or so
 * messages and kept alive by any body cut from it. The body comes out as
 * a Uint8Array of its own, of exact size.
 *
 * Only the shapes an envelope has are written here: strings, numbers,
 * booleans, bytes, the route and the headers; a payload of `Utf8Bytes` is
 * written as the str its text would be. A payload of another type
 * (an object from JSON) is handed to `packValue` and its bytes copied in.
 */
import { MESSAGE_ID_CHARS, MessageIds } from "./message-id.ts";
import { Utf8Bytes } from "./utf8-bytes.ts";

/** The bytes of one msgpack value (the caller's msgpack encoder, for payloads that are neither text nor bytes). */
export type PackValue = (value: unknown) => Uint8Array;

/**
 * An envelope's fields by their camelCase names (envelope.ts `EnvelopeFields`),
 * read as unknown: each is checked as it is written.
 */
type Fields = Readonly<Record<string, unknown>>;

const utf8 = new TextEncoder();
const key = (k: string): Uint8Array => {
  const b = utf8.encode(k);
  return Uint8Array.of(0xa0 | b.length, ...b);
};
const K = {
  v: key("v"),
  id: key("id"),
  ts: key("ts"),
  channel: key("channel"),
  origin: key("origin"),
  type: key("type"),
  correlationId: key("correlation_id"),
  serviceName: key("service_name"),
  expires: key("expires"),
  contentType: key("content_type"),
  replyTo: key("reply_to"),
  correlationData: key("correlation_data"),
  headers: key("headers"),
  utf8: key("utf8"),
  retain: key("retain"),
  publisher: key("publisher"),
  qos: key("qos"),
  route: key("route"),
  payload: key("payload"),
};

/** A new message's metadata when it has none. */
const NO_META: Fields = Object.freeze({});

/** UTF-16 length of a string field (0 for anything else, which the writer then refuses). */
const slen = (s: unknown): number => (typeof s === "string" ? s.length : 0);

/** Envelopes up to this size are written in the scratch buffer; larger ones are left to msgpackr. */
const SCRATCH_BYTES = 64 * 1024;

/** Writes envelope bodies into one scratch buffer and hands out exact copies. */
export class EnvelopeWriter {
  private readonly buf = new Uint8Array(SCRATCH_BYTES);
  /** The same bytes, for Buffer's native UTF-8 write of longer strings. */
  private readonly nodeBuf = Buffer.from(this.buf.buffer, 0, SCRATCH_BYTES);
  private readonly view = new DataView(this.buf.buffer);
  private pos = 0;

  constructor(private readonly packValue: PackValue) {}

  /**
   * The body of `f`, or null when it does not fit the scratch buffer or a
   * field is not of its type (the caller then encodes it the general way,
   * which gives the same bytes or the same error). The metadata fields are
   * read from `meta` when it is given (a publish's, not copied into `fields`
   * first), else from `fields`.
   */
  write(fields: object, v: number, meta?: object): Uint8Array | null {
    const f = fields as Fields;
    return this.body(v, f.id, f.ts, f.channel, f.origin, f.type, f.correlationId, f.serviceName, (meta ?? fields) as Fields, f.route, f.payload);
  }

  /**
   * `write` for a new message of `origin` (the route is `[origin]`), from
   * its fields one by one: a publish builds neither the fields' object nor
   * the route's array, which were two of the few objects a message leaves.
   * `id` may be the generator itself: a new id for `ts` is written in
   * place, with no string made for it.
   */
  writeNew(
    v: number,
    id: string | MessageIds,
    ts: number,
    channel: string,
    origin: string,
    type: string,
    correlationId: string | undefined,
    serviceName: string | undefined,
    meta: object | undefined,
    payload: unknown,
  ): Uint8Array | null {
    return this.body(v, id, ts, channel, origin, type, correlationId, serviceName, (meta ?? NO_META) as Fields, null, payload);
  }

  /** The body; `route` null: a new message's, `[origin]`. */
  private body(
    v: number,
    id: unknown,
    ts: unknown,
    channel: unknown,
    origin: unknown,
    type: unknown,
    correlationId: unknown,
    serviceName: unknown,
    m: Fields,
    route: unknown,
    p: unknown,
  ): Uint8Array | null {
    let packed: Uint8Array | null = null;
    let need = 64 + MESSAGE_ID_CHARS + 3 * (slen(id) + slen(channel) + slen(origin) + slen(type));
    if (typeof p === "string") need += 3 * p.length;
    else if (p instanceof Uint8Array) need += p.length;
    else if (p instanceof Utf8Bytes) need += p.bytes.length;
    else if (p !== undefined && p !== null) {
      packed = this.packValue(p);
      need += packed.length;
    }
    need += 3 * (slen(correlationId) + slen(serviceName));
    if (route === null) need += 5 + 3 * slen(origin);
    else if (!Array.isArray(route)) return null;
    else for (const r of route) need += 5 + 3 * slen(r);
    if (need > SCRATCH_BYTES / 2) return null;
    let entries = 8;
    if (correlationId !== undefined) entries++;
    if (serviceName !== undefined) entries++;
    if (m.expires !== undefined) entries++;
    if (m.contentType !== undefined) entries++;
    if (m.replyTo !== undefined) entries++;
    if (m.correlationData !== undefined) entries++;
    if (m.headers !== undefined) entries++;
    if (m.utf8 !== undefined) entries++;
    if (m.retain !== undefined) entries++;
    if (m.publisher !== undefined) entries++;
    if (m.qos !== undefined) entries++;
    // A map16 header whatever the count, as msgpackr writes every plain object.
    this.buf[0] = 0xde;
    this.buf[1] = 0;
    this.buf[2] = entries;
    this.pos = 3;
    this.raw(K.v);
    this.num(v);
    this.raw(K.id);
    if (id instanceof MessageIds && typeof ts === "number") {
      // Its 36 ASCII characters, as msgpackr writes a string of that length (str8).
      this.buf[this.pos++] = 0xd9;
      this.buf[this.pos++] = MESSAGE_ID_CHARS;
      id.write(this.buf, this.pos, ts);
      this.pos += MESSAGE_ID_CHARS;
    } else if (!this.str(id)) return null;
    this.raw(K.ts);
    if (!this.num(ts)) return null;
    this.raw(K.channel);
    if (!this.str(channel)) return null;
    this.raw(K.origin);
    if (!this.str(origin)) return null;
    this.raw(K.type);
    if (!this.str(type)) return null;
    if (correlationId !== undefined && !(this.raw(K.correlationId) && this.str(correlationId))) return null;
    if (serviceName !== undefined && !(this.raw(K.serviceName) && this.str(serviceName))) return null;
    if (m.expires !== undefined && !(this.raw(K.expires) && this.num(m.expires))) return null;
    if (m.contentType !== undefined && !(this.raw(K.contentType) && this.small(m.contentType))) return null;
    if (m.replyTo !== undefined && !(this.raw(K.replyTo) && this.small(m.replyTo))) return null;
    if (m.correlationData !== undefined && !(this.raw(K.correlationData) && this.small(m.correlationData))) return null;
    if (m.headers !== undefined && !(this.raw(K.headers) && this.headers(m.headers))) return null;
    if (m.utf8 !== undefined && !(this.raw(K.utf8) && this.bool(m.utf8))) return null;
    if (m.retain !== undefined && !(this.raw(K.retain) && this.bool(m.retain))) return null;
    if (m.publisher !== undefined && !(this.raw(K.publisher) && this.small(m.publisher))) return null;
    if (m.qos !== undefined && !(this.raw(K.qos) && this.num(m.qos))) return null;
    this.raw(K.route);
    if (route === null) {
      this.arrayHeader(1);
      this.str(origin);
    } else if (!this.strings(route)) return null;
    this.raw(K.payload);
    if (typeof p === "string") this.str(p);
    else if (p instanceof Uint8Array) this.bin(p);
    else if (p instanceof Utf8Bytes) this.utf8(p.bytes);
    else if (packed) this.raw(packed);
    else this.buf[this.pos++] = 0xc0;
    return this.buf.slice(0, this.pos);
  }

  private raw(b: Uint8Array): true {
    const n = b.length;
    if (n > 32) {
      this.buf.set(b, this.pos);
      this.pos += n;
      return true;
    }
    // A key: a native copy's call costs more than the loop for a few bytes.
    const buf = this.buf;
    let at = this.pos;
    for (let i = 0; i < n; i++) buf[at++] = b[i]!;
    this.pos = at;
    return true;
  }

  /** A metadata value of unbounded size: written only while the scratch buffer has room for it. */
  private small(v: unknown): boolean {
    const room = SCRATCH_BYTES - this.pos - 16;
    if (typeof v === "string") return 3 * v.length <= room && this.str(v);
    if (v instanceof Uint8Array) return v.length <= room && this.bin(v);
    return false;
  }

  private bool(v: unknown): boolean {
    if (typeof v !== "boolean") return false;
    this.buf[this.pos++] = v ? 0xc3 : 0xc2;
    return true;
  }

  /** A number as msgpackr writes it: the smallest integer form up to 32 bits, else a float64. */
  private num(v: unknown): boolean {
    if (typeof v !== "number") return false;
    const b = this.buf;
    if (v >>> 0 === v) {
      if (v < 0x80) b[this.pos++] = v;
      else if (v < 0x100) {
        b[this.pos++] = 0xcc;
        b[this.pos++] = v;
      } else if (v < 0x10000) {
        b[this.pos++] = 0xcd;
        b[this.pos++] = v >> 8;
        b[this.pos++] = v & 0xff;
      } else {
        b[this.pos++] = 0xce;
        this.view.setUint32(this.pos, v);
        this.pos += 4;
      }
    } else if (v >> 0 === v) {
      if (v >= -0x20) b[this.pos++] = 0x100 + v;
      else if (v >= -0x80) {
        b[this.pos++] = 0xd0;
        b[this.pos++] = v + 0x100;
      } else if (v >= -0x8000) {
        b[this.pos++] = 0xd1;
        this.view.setInt16(this.pos, v);
        this.pos += 2;
      } else {
        b[this.pos++] = 0xd2;
        this.view.setInt32(this.pos, v);
        this.pos += 4;
      }
    } else {
      b[this.pos++] = 0xcb;
      this.view.setFloat64(this.pos, v);
      this.pos += 8;
    }
    return true;
  }

  /** A string with the smallest header for its UTF-8 length (lone surrogates as U+FFFD, as TextEncoder). */
  private str(s: unknown): boolean {
    if (typeof s !== "string") return false;
    const n = s.length;
    const b = this.buf;
    if (n < 0x40) {
      // At most 189 bytes: a fixstr or str8 header. Fewer than 32 UTF-16 units are written after a
      // fixstr's byte (moved on by one in the rare case their UTF-8 needs str8), more after str8's two.
      const start = n < 0x20 ? this.pos + 1 : this.pos + 2;
      let at = start;
      for (let i = 0; i < n; i++) {
        let c = s.charCodeAt(i);
        if (c < 0x80) b[at++] = c;
        else if (c < 0x800) {
          b[at++] = (c >> 6) | 0xc0;
          b[at++] = (c & 0x3f) | 0x80;
        } else if ((c & 0xfc00) === 0xd800 && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
          c = 0x10000 + ((c & 0x03ff) << 10) + (s.charCodeAt(++i) & 0x03ff);
          b[at++] = (c >> 18) | 0xf0;
          b[at++] = ((c >> 12) & 0x3f) | 0x80;
          b[at++] = ((c >> 6) & 0x3f) | 0x80;
          b[at++] = (c & 0x3f) | 0x80;
        } else if ((c & 0xf800) === 0xd800) {
          b[at++] = 0xef;
          b[at++] = 0xbf;
          b[at++] = 0xbd;
        } else {
          b[at++] = (c >> 12) | 0xe0;
          b[at++] = ((c >> 6) & 0x3f) | 0x80;
          b[at++] = (c & 0x3f) | 0x80;
        }
      }
      const len = at - start;
      if (len < 0x20) {
        b[this.pos] = 0xa0 | len;
        this.pos = at;
      } else {
        if (start === this.pos + 1) {
          b.copyWithin(this.pos + 2, start, at);
          at++;
        }
        b[this.pos] = 0xd9;
        b[this.pos + 1] = len;
        this.pos = at;
      }
      return true;
    }
    // Longer: Buffer's native UTF-8 write after a str32 header's room, moved back to the header it needs.
    const len = this.nodeBuf.write(s, this.pos + 5, "utf8");
    const from = this.pos + 5;
    if (len < 0x100) {
      b[this.pos] = 0xd9;
      b[this.pos + 1] = len;
      b.copyWithin(this.pos + 2, from, from + len);
      this.pos += 2 + len;
    } else if (len < 0x10000) {
      b[this.pos] = 0xda;
      b[this.pos + 1] = len >> 8;
      b[this.pos + 2] = len & 0xff;
      b.copyWithin(this.pos + 3, from, from + len);
      this.pos += 3 + len;
    } else {
      b[this.pos] = 0xdb;
      this.view.setUint32(this.pos + 1, len);
      this.pos += 5 + len;
    }
    return true;
  }

  /** Bytes known to be valid UTF-8, as the str a string of them gets (the same header `str` picks). */
  private utf8(v: Uint8Array): void {
    if (v.length < 0x20) this.buf[this.pos++] = 0xa0 | v.length;
    else this.sized(v.length, 0xd9);
    this.bytes(v);
  }

  private bin(v: Uint8Array): true {
    this.sized(v.length, 0xc4);
    this.bytes(v);
    return true;
  }

  /** The header of a str or bin of `n` bytes: `type8`, then the 16- and 32-bit types that follow it. */
  private sized(n: number, type8: number): void {
    const b = this.buf;
    if (n < 0x100) {
      b[this.pos++] = type8;
      b[this.pos++] = n;
    } else if (n < 0x10000) {
      b[this.pos++] = type8 + 1;
      b[this.pos++] = n >> 8;
      b[this.pos++] = n & 0xff;
    } else {
      b[this.pos++] = type8 + 2;
      this.view.setUint32(this.pos, n);
      this.pos += 4;
    }
  }

  private bytes(v: Uint8Array): void {
    this.buf.set(v, this.pos);
    this.pos += v.length;
  }

  private arrayHeader(n: number): void {
    const b = this.buf;
    if (n < 0x10) b[this.pos++] = 0x90 | n;
    else if (n < 0x10000) {
      b[this.pos++] = 0xdc;
      b[this.pos++] = n >> 8;
      b[this.pos++] = n & 0xff;
    } else {
      b[this.pos++] = 0xdd;
      this.view.setUint32(this.pos, n);
      this.pos += 4;
    }
  }

  private strings(list: unknown): boolean {
    if (!Array.isArray(list)) return false;
    this.arrayHeader(list.length);
    for (const s of list) if (!this.str(s)) return false;
    return true;
  }

  private headers(list: unknown): boolean {
    if (!Array.isArray(list)) return false;
    this.arrayHeader(list.length);
    for (const h of list) {
      if (!Array.isArray(h)) return false;
      this.arrayHeader(h.length);
      for (const s of h) if (typeof s !== "string" || !this.small(s)) return false;
    }
    return true;
  }
}
