/**
 * The envelope: what one stored record holds (docs/storage.md, "The envelope body").
 *
 * On disk the envelope is a plain msgpack map with the snake_case keys of the
 * spec, so that C and Python programs can decode the log with any msgpack
 * library. `seq` is not inside the map: the instance that stores a record
 * stamps it into the record header (see docs/storage.md), which is what lets
 * a forwarded record keep its bytes while every hop numbers it anew.
 */
import { Packr } from "msgpackr";
import { InvalidArgumentError } from "../errors.ts";
import type { MessageIds } from "./message-id.ts";
import { Utf8Bytes } from "./utf8-bytes.ts";
import { EnvelopeWriter } from "./writer.ts";

/** Envelope format version written into every record. */
export const ENVELOPE_VERSION = 1;

/**
 * What a message may carry besides its payload, for protocols that say more
 * than keyop's own API (MQTT 5 above all). Every field is optional and
 * absent from the stored body unless set, so the body of a plain publish is
 * unchanged, and a reader that does not know a field skips it.
 */
export interface MessageMeta {
  /** Unix epoch ms after which the message is no longer delivered (MQTT message expiry). */
  expires?: number;
  /** MIME type of the payload (MQTT content type). */
  contentType?: string;
  /** Channel a reply should go to (MQTT response topic, mapped to a channel). */
  replyTo?: string;
  /** Bytes a reply echoes (MQTT correlation data). */
  correlationData?: Uint8Array;
  /** Name and value pairs, in order; a name may repeat (MQTT user properties). */
  headers?: [string, string][];
  /** The payload is UTF-8 text (MQTT payload format indicator 1). */
  utf8?: boolean;
  /** Published as its topic's retained message (MQTT retain flag). */
  retain?: boolean;
  /** The client that published it, at its origin (for MQTT's no local). */
  publisher?: string;
  /** The QoS it was published with over MQTT: a subscriber gets it at no higher QoS. */
  qos?: 0 | 1 | 2;
}

/** The MessageMeta keys as stored (snake_case), in their order in the body. */
const META_KEYS: [keyof MessageMeta, string][] = [
  ["expires", "expires"],
  ["contentType", "content_type"],
  ["replyTo", "reply_to"],
  ["correlationData", "correlation_data"],
  ["headers", "headers"],
  ["utf8", "utf8"],
  ["retain", "retain"],
  ["publisher", "publisher"],
  ["qos", "qos"],
];

/** A message as handlers and library callers see it (camelCase). */
export interface Message<T = unknown> extends MessageMeta {
  v: number;
  /** UUIDv7, unique across the federation. */
  id: string;
  /** Per-channel sequence number assigned by the instance that stored it. */
  seq: number;
  /** Publish time, Unix epoch milliseconds. */
  ts: number;
  channel: string;
  /** Instance that first published the message. */
  origin: string;
  /** Payload type name. */
  type: string;
  correlationId?: string;
  serviceName?: string;
  /** Instance names that have stored the message, in order. */
  route: string[];
  payload: T;
}

/** The fields a publisher supplies; the rest are stamped by keyop. */
export interface EnvelopeFields extends MessageMeta {
  id: string;
  ts: number;
  channel: string;
  origin: string;
  type: string;
  correlationId?: string | undefined;
  serviceName?: string | undefined;
  route: string[];
  payload: unknown;
}

/** Plain msgpack, no msgpackr record extension: any decoder reads the log. */
const packr = new Packr({ useRecords: false, moreTypes: false, int64AsType: "number", encodeUndefinedAsNil: true });

/** Longest payload type name, correlation id or service name. */
export const MAX_LABEL_BYTES = 256;

/**
 * The snake_case map of docs/storage.md in its documented key order; `seq` is
 * included only for the wire form (the stored body has it in the header).
 */
function snake(f: EnvelopeFields & { v?: number }, seq?: number): Record<string, unknown> {
  const out: Record<string, unknown> = { v: f.v ?? ENVELOPE_VERSION, id: f.id };
  if (seq !== undefined) out.seq = seq;
  out.ts = f.ts;
  out.channel = f.channel;
  out.origin = f.origin;
  out.type = f.type;
  if (f.correlationId !== undefined) out.correlation_id = f.correlationId;
  if (f.serviceName !== undefined) out.service_name = f.serviceName;
  for (const [k, snakeKey] of META_KEYS) if (f[k] !== undefined) out[snakeKey] = f[k];
  out.route = f.route;
  out.payload = f.payload === undefined ? null : f.payload instanceof Utf8Bytes ? f.payload.toString() : f.payload;
  return out;
}

/** The envelope's fields written by hand; msgpackr for the rest and the envelopes too large for its buffer. */
const writer = new EnvelopeWriter((value) => packr.pack(value));

/**
 * Encodes the stored body of an envelope (everything but `seq`); with
 * `meta`, its fields are the metadata (`f`'s own are then not read).
 */
export function encodeEnvelope(f: EnvelopeFields & { v?: number }, meta?: MessageMeta): Uint8Array {
  return writer.write(f, f.v ?? ENVELOPE_VERSION, meta) ?? packr.pack(snake(meta ? { ...f, ...meta } : f));
}

/**
 * `encodeEnvelope` of a new message: version `ENVELOPE_VERSION`, route
 * `[origin]`, the metadata from `meta`; from the fields one by one, with no
 * object built for them on the way. With the generator for `id`, a new id
 * is written into the body and no string is made for it.
 */
export function encodeNewEnvelope(
  id: string | MessageIds,
  ts: number,
  channel: string,
  origin: string,
  type: string,
  correlationId: string | undefined,
  serviceName: string | undefined,
  meta: MessageMeta | undefined,
  payload: unknown,
): Uint8Array {
  return (
    writer.writeNew(ENVELOPE_VERSION, id, ts, channel, origin, type, correlationId, serviceName, meta, payload) ??
    encodeEnvelope({ id: typeof id === "string" ? id : id.next(ts), ts, channel, origin, type, correlationId, serviceName, route: [origin], payload }, meta)
  );
}

/**
 * Decodes a stored body and adds the `seq` from its record header. Throws on
 * bytes that are not an envelope; callers only pass CRC-checked records.
 */
export function decodeEnvelope<T = unknown>(body: Uint8Array, seq: number): Message<T> {
  const raw = packr.unpack(body) as Record<string, unknown> | null;
  if (raw === null || typeof raw !== "object" || typeof raw.id !== "string" || typeof raw.channel !== "string") {
    throw new InvalidArgumentError("record body is not an envelope");
  }
  const msg: Message<T> = {
    v: Number(raw.v ?? ENVELOPE_VERSION),
    id: raw.id,
    seq,
    ts: Number(raw.ts),
    channel: raw.channel,
    origin: String(raw.origin ?? ""),
    type: String(raw.type ?? ""),
    route: Array.isArray(raw.route) ? (raw.route as unknown[]).map(String) : [],
    payload: raw.payload as T,
  };
  if (typeof raw.correlation_id === "string") msg.correlationId = raw.correlation_id;
  if (typeof raw.service_name === "string") msg.serviceName = raw.service_name;
  readMeta(raw, msg);
  return msg;
}

/**
 * Copies the MessageMeta fields of a decoded body into `into`. A field of
 * the wrong type is left out, not an error: a record is stored as it came
 * from its publisher, and a reader must still deliver it.
 */
export function readMeta(raw: Record<string, unknown>, into: MessageMeta): void {
  if (typeof raw.expires === "number" && Number.isFinite(raw.expires)) into.expires = raw.expires;
  if (typeof raw.content_type === "string") into.contentType = raw.content_type;
  if (typeof raw.reply_to === "string") into.replyTo = raw.reply_to;
  if (raw.correlation_data instanceof Uint8Array) into.correlationData = raw.correlation_data;
  if (Array.isArray(raw.headers) && raw.headers.every((h) => Array.isArray(h) && h.length === 2 && typeof h[0] === "string" && typeof h[1] === "string")) {
    into.headers = raw.headers as [string, string][];
  }
  if (raw.utf8 === true) into.utf8 = true;
  if (raw.retain === true) into.retain = true;
  if (typeof raw.publisher === "string") into.publisher = raw.publisher;
  if (raw.qos === 0 || raw.qos === 1 || raw.qos === 2) into.qos = raw.qos;
}

/** The MessageMeta fields set in `meta`, with their stored (snake_case) keys. */
export function metaFields(meta: MessageMeta): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, snakeKey] of META_KEYS) if (meta[k] !== undefined) out[snakeKey] = meta[k];
  return out;
}

/** Plain msgpack of a value (keyop's own files besides the log: retained messages). */
export function encodeValue(value: unknown): Uint8Array {
  return packr.pack(value);
}

/** One msgpack value (a payload read out of a stored body by its byte range). */
export function decodeValue(bytes: Uint8Array): unknown {
  return packr.unpack(bytes);
}

/** The JSON form of the HTTP API and CLI: snake_case keys, `seq` included. */
export function toWire(msg: Message): Record<string, unknown> {
  return snake(msg, msg.seq);
}

/** Throws unless `value` is a non-empty label of at most MAX_LABEL_BYTES. */
export function assertLabel(value: unknown, what: string): asserts value is string {
  if (typeof value !== "string" || value.length === 0) {
    throw new InvalidArgumentError(`${what} must be a non-empty string`);
  }
  if (Buffer.byteLength(value) > MAX_LABEL_BYTES) {
    throw new InvalidArgumentError(`${what} longer than ${MAX_LABEL_BYTES} bytes`);
  }
}
