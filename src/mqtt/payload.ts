/** MQTT payloads and the one packet written by hand, between the wire and the store. */
import { isUtf8 } from "node:buffer";
import { decodeValue } from "../envelope/envelope.ts";
import type { EnvelopeView } from "../envelope/scan.ts";
import { Utf8Bytes } from "../envelope/utf8-bytes.ts";

/**
 * A PUBACK with success, written by hand: the one packet sent per QoS 1
 * publish. Four bytes in MQTT 3.1.1 and 5.0 alike (5.0 lets the reason
 * code and properties go when the reason is success).
 */
export function pubackBytes(id: number): Uint8Array {
  return Uint8Array.of(0x40, 0x02, (id >> 8) & 0xff, id & 0xff);
}

/**
 * MQTT payload bytes as stored: valid UTF-8 as text (a msgpack str, readable
 * over HTTP; its bytes copied as they are when the message is built, so
 * `bytes` may be a view of a reused buffer until then), anything else as
 * bytes (copied).
 */
export function payloadOf(bytes: Uint8Array): Utf8Bytes | Uint8Array {
  return isUtf8(bytes) ? new Utf8Bytes(bytes) : new Uint8Array(bytes);
}

/** A stored payload as MQTT bytes: bytes unchanged, strings as UTF-8, anything else as JSON. */
export function bytesOf(payload: unknown): Buffer {
  if (payload instanceof Uint8Array) return Buffer.from(payload);
  if (typeof payload === "string") return Buffer.from(payload, "utf8");
  return Buffer.from(JSON.stringify(payload ?? null), "utf8");
}

/**
 * The MQTT bytes of a stored envelope's payload, read out of the stored
 * bytes by its range: text and binary are the bytes they are stored as (no
 * decoding into a string and encoding back), anything else becomes JSON.
 */
export function storedPayload(body: Uint8Array, v: EnvelopeView): Uint8Array {
  const at = v.payloadStart;
  if (at < 0) return NULL_JSON;
  const b = body[at]!;
  let len = -1;
  let start = at;
  if ((b & 0xe0) === 0xa0) {
    len = b & 0x1f;
    start = at + 1;
  } else if (b === 0xd9 || b === 0xc4) {
    len = body[at + 1]!;
    start = at + 2;
  } else if (b === 0xda || b === 0xc5) {
    len = (body[at + 1]! << 8) | body[at + 2]!;
    start = at + 3;
  } else if (b === 0xdb || b === 0xc6) {
    len = body[at + 1]! * 0x1000000 + ((body[at + 2]! << 16) | (body[at + 3]! << 8) | body[at + 4]!);
    start = at + 5;
  }
  // A small payload is copied: a first view of a small array moves all its bytes out of the
  // JavaScript heap (several times the copy's cost); a large one is a view.
  if (len >= 0) return len <= SMALL_COPY ? body.slice(start, start + len) : body.subarray(start, start + len);
  return bytesOf(decodeValue(body.subarray(at, v.payloadEnd)));
}

const NULL_JSON = new TextEncoder().encode("null");

/** Payloads up to this many bytes are copied out of the stored body rather than viewed. */
const SMALL_COPY = 4096;
