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
import { Packr } from "msgpackr";
import { KeyopError } from "../errors.ts";

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
} as const;
/** A frame type number. */
export type FrameTypeId = (typeof FrameType)[keyof typeof FrameType];
const TYPE_NAMES: Record<number, string> = Object.fromEntries(Object.entries(FrameType).map(([k, v]) => [v, k]));

/** A decoded frame: its type and its body (a msgpack map). */
export interface Frame {
  type: FrameTypeId;
  body: Record<string, unknown>;
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
  const view = new DataView(out.buffer);
  view.setUint16(0, MAGIC);
  out[2] = PROTOCOL_VERSION;
  out[3] = type;
  view.setUint32(4, payload.length);
  out.set(payload, HEADER_BYTES);
  return out;
}

function decodeBody(type: number, bytes: Uint8Array): Frame {
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
  return { type: type as FrameTypeId, body: body as Record<string, unknown> };
}

/**
 * Incremental decoder for one connection: feed it bytes as they arrive, get
 * whole frames back. Holds at most one unfinished frame, whose declared
 * size has already been checked against `maxBody`.
 */
export class FrameDecoder {
  private readonly maxBody: number;
  private buf: Uint8Array = new Uint8Array(0);
  private failed = false;

  constructor(maxBody: number) {
    this.maxBody = Math.min(maxBody, HARD_MAX_BODY);
  }

  /** Bytes held for an unfinished frame. */
  get buffered(): number {
    return this.buf.length;
  }

  /** Frames completed by `chunk`; throws `FrameError` (and stays failed) on bad input. */
  push(chunk: Uint8Array): Frame[] {
    if (this.failed) throw new FrameError("decoder already failed");
    try {
      return this.take(chunk);
    } catch (err) {
      this.failed = true;
      this.buf = new Uint8Array(0);
      if (err instanceof FrameError) throw err;
      throw new FrameError(err instanceof Error ? err.message : String(err));
    }
  }

  private take(chunk: Uint8Array): Frame[] {
    let data: Uint8Array;
    if (this.buf.length === 0) data = chunk;
    else {
      data = new Uint8Array(this.buf.length + chunk.length);
      data.set(this.buf);
      data.set(chunk, this.buf.length);
    }
    const frames: Frame[] = [];
    let off = 0;
    while (data.length - off >= HEADER_BYTES) {
      const view = new DataView(data.buffer, data.byteOffset + off, HEADER_BYTES);
      if (view.getUint16(0) !== MAGIC) throw new FrameError(`bad magic 0x${view.getUint16(0).toString(16).padStart(4, "0")}`);
      const version = data[off + 2]!;
      if (version !== PROTOCOL_VERSION) throw new FrameError(`unsupported protocol version ${version}`);
      const type = data[off + 3]!;
      if (!(type in TYPE_NAMES)) throw new FrameError(`unknown frame type ${type}`);
      const len = view.getUint32(4);
      // The limit is checked on the header alone, before any of the body is kept.
      if (len > this.maxBody) throw new FrameError(`${frameTypeName(type)} of ${len} bytes exceeds the limit of ${this.maxBody}`);
      if (len === 0) throw new FrameError(`${frameTypeName(type)} has an empty body`);
      if (data.length - off - HEADER_BYTES < len) break;
      const start = off + HEADER_BYTES;
      frames.push(decodeBody(type, data.subarray(start, start + len)));
      off = start + len;
    }
    this.buf = off === data.length ? new Uint8Array(0) : data.slice(off);
    return frames;
  }
}
