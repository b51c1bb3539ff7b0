/**
 * The federation wire format: length-prefixed binary frames (docs/protocol.md).
 *
 *   offset 0  2 bytes  magic "KY" (0x4b 0x59)
 *   offset 2  u8       protocol version (1)
 *   offset 3  u8       frame type
 *   offset 4  u32 BE   body length
 *   offset 8  body     msgpack map (the frame type says which keys)
 *
 * This module only turns bytes into frames and back: no sockets, no state
 * beyond the bytes of one unfinished frame. The declared length is checked
 * against the limit before a byte of the body is buffered, and every
 * malformed input ends in a `FrameError`, never in another exception.
 */
import { CopyBlocks, getU16BE, getU32BE, setU16BE, setU32BE } from "../bytes.ts";
import { Packr } from "msgpackr";
import { KeyopError } from "../errors.ts";
import { readSimpleMap } from "./simple-map.ts";

/** First two bytes of every frame. */
export const MAGIC = 0x4b59;
/** The protocol version this build speaks. */
export const PROTOCOL_VERSION = 1;
/** Bytes before the body. */
export const HEADER_BYTES = 8;
/** Largest body any build accepts, whatever the configuration says. */
export const HARD_MAX_BODY = 64 * 1024 * 1024;

/** Frame types. */
export const FrameType = {
  HELLO: 1,
  WELCOME: 2,
  BATCH: 3,
  ACK: 4,
  PING: 5,
  PONG: 6,
  CLOSE: 7,
  /** A BATCH compressed with the codec agreed in HELLO/WELCOME (compression.ts). */
  COMPRESSED: 8,
  /** A reply to a request that crossed the link, going back towards its requester (not stored, not acknowledged). */
  REPLY: 9,
} as const;
/** A frame type number. */
export type FrameTypeId = (typeof FrameType)[keyof typeof FrameType];
const TYPE_NAMES: Record<number, string> = Object.fromEntries(Object.entries(FrameType).map(([k, v]) => [v, k]));

/** A decoded frame: its type and its body (a msgpack map). */
export interface Frame {
  type: FrameTypeId;
  body: Record<string, unknown>;
  /** Bytes of the frame, header included. */
  size: number;
}

/** Malformed bytes from a peer; the connection must be closed and audited. */
export class FrameError extends KeyopError {
  constructor(message: string) {
    super("malformed_frame", `malformed frame: ${message}`);
    this.name = "FrameError";
  }
}

const packr = new Packr({ useRecords: false, moreTypes: false, mapsAsObjects: true, int64AsType: "number", encodeUndefinedAsNil: true });

/** Name of a frame type, for logs. */
export function frameTypeName(t: number): string {
  return TYPE_NAMES[t] ?? `unknown(${t})`;
}

/** Encodes one frame. Throws `FrameError` if the body exceeds `maxBody`. */
export function encodeFrame(type: FrameTypeId, body: Record<string, unknown>, maxBody = HARD_MAX_BODY): Uint8Array {
  const payload = packr.pack(body);
  if (payload.length > maxBody) throw new FrameError(`${frameTypeName(type)} body of ${payload.length} bytes exceeds ${maxBody}`);
  const out = new Uint8Array(HEADER_BYTES + payload.length);
  setU16BE(out, 0, MAGIC);
  out[2] = PROTOCOL_VERSION;
  out[3] = type;
  setU32BE(out, 4, payload.length);
  out.set(payload, HEADER_BYTES);
  return out;
}

/** Decodes a frame body of `type` (a msgpack map); throws `FrameError`. */
export function decodeFrameBody(type: number, bytes: Uint8Array): Frame {
  const simple = readSimpleMap(bytes);
  if (simple !== null) return { type: type as FrameTypeId, body: simple, size: HEADER_BYTES + bytes.length };
  let body: unknown;
  try {
    body = packr.unpack(bytes);
  } catch (err) {
    throw new FrameError(`${frameTypeName(type)} body is not msgpack (${err instanceof Error ? err.message : String(err)})`);
  }
  // Only a plain map: msgpackr also yields arrays, bytes, dates and, for the reserved byte 0xc1, a marker object.
  if (body === null || typeof body !== "object" || Object.getPrototypeOf(body) !== Object.prototype) {
    throw new FrameError(`${frameTypeName(type)} body is not a map`);
  }
  return { type: type as FrameTypeId, body: body as Record<string, unknown>, size: HEADER_BYTES + bytes.length };
}

/**
 * Incremental decoder for one connection: feed it bytes as they arrive, get
 * whole frames back. Holds at most one unfinished frame, whose declared
 * size has already been checked against `maxBody`. Incoming chunks are kept
 * in a list and each frame is assembled once, so a large frame arriving in
 * many small chunks costs one copy, not one per chunk.
 */
export class FrameDecoder {
  private readonly maxBody: number;
  private readonly blocks: CopyBlocks;
  private chunks: Uint8Array[] = [];
  private size = 0;
  private failed = false;

  /**
   * `blocks`: where incoming chunks are copied (sessions of one listener
   * share theirs). A socket's chunk is an array of its own that a view
   * would move out of the JavaScript heap, and frames are views.
   */
  constructor(maxBody: number, blocks: CopyBlocks = new CopyBlocks()) {
    this.maxBody = Math.min(maxBody, HARD_MAX_BODY);
    this.blocks = blocks;
  }

  /** Bytes held for an unfinished frame. */
  get buffered(): number {
    return this.size;
  }

  /** Frames completed by `chunk`; throws `FrameError` (and stays failed) on bad input. */
  push(chunk: Uint8Array): Frame[] {
    if (this.failed) throw new FrameError("decoder already failed");
    try {
      // A copy: the caller may reuse `chunk` after we return, and frames may be kept longer.
      this.chunks.push(this.blocks.copy(chunk));
      this.size += chunk.length;
      return this.frames();
    } catch (err) {
      this.failed = true;
      this.chunks = [];
      this.size = 0;
      if (err instanceof FrameError) throw err;
      throw new FrameError(err instanceof Error ? err.message : String(err));
    }
  }

  private frames(): Frame[] {
    const frames: Frame[] = [];
    if (this.chunks.length === 1) {
      // The usual case, all that is held in one chunk: its frames are cut out of it where they
      // lie, and only an unfinished rest is kept.
      const c = this.chunks[0]!;
      let at = 0;
      while (c.length - at >= HEADER_BYTES) {
        const len = this.bodyLength(c, at);
        if (c.length - at < HEADER_BYTES + len) break;
        frames.push(decodeFrameBody(c[at + 3]!, c.subarray(at + HEADER_BYTES, at + HEADER_BYTES + len)));
        at += HEADER_BYTES + len;
      }
      this.size -= at;
      if (at === c.length) this.chunks.length = 0;
      else if (at > 0) this.chunks[0] = c.subarray(at);
      return frames;
    }
    while (this.size >= HEADER_BYTES) {
      const len = this.bodyLength(this.peek(HEADER_BYTES), 0);
      if (this.size < HEADER_BYTES + len) break;
      const bytes = this.take(HEADER_BYTES + len);
      frames.push(decodeFrameBody(bytes[3]!, bytes.subarray(HEADER_BYTES)));
    }
    return frames;
  }

  /** Checks the frame header at `at` of `b` and gives its body's length (checked on the header alone, before more of the body is kept). */
  private bodyLength(b: Uint8Array, at: number): number {
    const magic = getU16BE(b, at);
    if (magic !== MAGIC) throw new FrameError(`bad magic 0x${magic.toString(16).padStart(4, "0")}`);
    const version = b[at + 2]!;
    if (version !== PROTOCOL_VERSION) throw new FrameError(`unsupported protocol version ${version}`);
    const type = b[at + 3]!;
    if (!(type in TYPE_NAMES)) throw new FrameError(`unknown frame type ${type}`);
    const len = getU32BE(b, at + 4);
    if (len > this.maxBody) throw new FrameError(`${frameTypeName(type)} of ${len} bytes exceeds the limit of ${this.maxBody}`);
    if (len === 0) throw new FrameError(`${frameTypeName(type)} has an empty body`);
    return len;
  }

  /** The first `n` held bytes, without consuming them. */
  private peek(n: number): Uint8Array {
    const first = this.chunks[0]!;
    if (first.length >= n) return first.subarray(0, n);
    const out = new Uint8Array(n);
    let off = 0;
    for (const c of this.chunks) {
      const k = Math.min(c.length, n - off);
      out.set(c.subarray(0, k), off);
      off += k;
      if (off === n) break;
    }
    return out;
  }

  /** Consumes the first `n` held bytes: a view when they sit in one chunk, else one copy. */
  private take(n: number): Uint8Array {
    this.size -= n;
    const first = this.chunks[0]!;
    if (first.length >= n) {
      if (first.length === n) this.chunks.shift();
      else this.chunks[0] = first.subarray(n);
      return first.subarray(0, n);
    }
    const out = this.blocks.alloc(n); // filled completely below
    let off = 0;
    while (off < n) {
      const c = this.chunks[0]!;
      const k = Math.min(c.length, n - off);
      out.set(c.subarray(0, k), off);
      off += k;
      if (k === c.length) this.chunks.shift();
      else this.chunks[0] = c.subarray(k);
    }
    return out;
  }
}
