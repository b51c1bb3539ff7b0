/**
 * The envelope of a new publish, built and checked in one place for every
 * publisher (the durable `Messenger`, the hub-backed `EphemeralMessenger`):
 * the same mistake gets the same error, whichever path it came in by.
 */
import { InvalidArgumentError, ReservedChannelError, TooLargeError } from "../errors.ts";
import { assertLabel, encodeNewEnvelope, type MessageMeta } from "./envelope.ts";
import type { MessageIds } from "./message-id.ts";
import { assertChannel, isDeadLetter } from "./names.ts";
import { scanEnvelope } from "./scan.ts";
import { Utf8Bytes } from "./utf8-bytes.ts";

/** What a publisher supplies, with its labels already resolved (options, context, defaults). */
export interface NewMessage {
  channel: string;
  type: string;
  payload: unknown;
  correlationId?: string | undefined;
  serviceName?: string | undefined;
  /** Protocol metadata (MQTT 5 properties), stored as given once checked. */
  meta?: MessageMeta | undefined;
}

/** The stored body of a new message, with the id and time stamped into it. */
export interface BuiltEnvelope {
  body: Uint8Array;
  id: string;
  ts: number;
}

/**
 * Checks `m` (a channel that is not a dead-letter one, labels), encodes it
 * as first published by `origin`, and checks what every receiver checks
 * before storing a forwarded record: at most `maxBytes`, nesting and
 * extension types a hub accepts. A record a hub would refuse would
 * otherwise close the link at every resend and stop everything behind it.
 */
export function buildEnvelope(origin: string, m: NewMessage, maxBytes: number, ids: MessageIds): BuiltEnvelope {
  assertPublishable(m.channel);
  return buildOnCheckedChannel(origin, m, maxBytes, ids);
}

/** Throws unless a publisher may publish on `channel`: a valid name, not a dead-letter channel. */
export function assertPublishable(channel: string): void {
  assertChannel(channel);
  if (isDeadLetter(channel)) throw new ReservedChannelError(channel);
}

/**
 * `buildEnvelope` for a channel already checked, dead-letter channels
 * included: what a messenger itself stores when a handler gives up.
 */
export function buildOnCheckedChannel(origin: string, m: NewMessage, maxBytes: number, ids: MessageIds): BuiltEnvelope {
  const ts = Date.now();
  const id = ids.next(ts);
  return { body: buildBody(origin, id, ts, m.channel, m.type, m.payload, m.correlationId, m.serviceName, m.meta, maxBytes), id, ts };
}

/**
 * `buildOnCheckedChannel`'s body, from the message's parts and with the
 * `id` and `ts` the caller made (its channel checked with
 * `assertPublishable` first): for a publisher that keeps no `NewMessage`,
 * and needs no `BuiltEnvelope`, per message (an MQTT client's publishes;
 * each object a message leaves costs more at a board's rate than its
 * making).
 */
export function buildBody(
  origin: string,
  id: string | MessageIds,
  ts: number,
  channel: string,
  type: string,
  payload: unknown,
  correlationId: string | undefined,
  serviceName: string | undefined,
  meta: MessageMeta | undefined,
  maxBytes: number,
): Uint8Array {
  assertLabel(type, "type");
  if (correlationId !== undefined) assertLabel(correlationId, "correlation id");
  if (serviceName !== undefined) assertLabel(serviceName, "service name");
  if (meta) assertMeta(meta);
  let body: Uint8Array;
  try {
    body = encodeNewEnvelope(id, ts, channel, origin, type, correlationId, serviceName, meta, payload);
  } catch (err) {
    throw new InvalidArgumentError(`payload cannot be encoded as msgpack: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (body.length > maxBytes) throw new TooLargeError(`message of ${body.length} bytes exceeds the limit of ${maxBytes}`);
  // Text and bytes cannot nest or hold extensions, and the metadata was checked: nothing to find.
  if (typeof payload === "string" || payload instanceof Uint8Array || payload instanceof Utf8Bytes) return body;
  try {
    scanEnvelope(body);
  } catch (err) {
    throw new InvalidArgumentError(`payload cannot be forwarded: ${err instanceof Error ? err.message : String(err)}`);
  }
  return body;
}

/** Longest metadata string (MQTT's own limit for a string property). */
const MAX_META_STRING = 65_535;

function metaString(v: unknown, what: string): void {
  if (typeof v !== "string" || Buffer.byteLength(v) > MAX_META_STRING) throw new InvalidArgumentError(`${what} must be a string of at most ${MAX_META_STRING} bytes`);
}

/** Throws InvalidArgumentError unless every field of `meta` has its type. */
export function assertMeta(meta: MessageMeta): void {
  if (meta.expires !== undefined && (!Number.isSafeInteger(meta.expires) || meta.expires <= 0)) throw new InvalidArgumentError("expires must be a positive integer (epoch ms)");
  if (meta.contentType !== undefined) metaString(meta.contentType, "content type");
  if (meta.replyTo !== undefined) assertChannel(meta.replyTo);
  if (meta.correlationData !== undefined && (!(meta.correlationData instanceof Uint8Array) || meta.correlationData.length > MAX_META_STRING)) {
    throw new InvalidArgumentError(`correlation data must be at most ${MAX_META_STRING} bytes`);
  }
  if (meta.headers !== undefined) {
    if (!Array.isArray(meta.headers)) throw new InvalidArgumentError("headers must be a list of [name, value] pairs");
    for (const h of meta.headers) {
      if (!Array.isArray(h) || h.length !== 2) throw new InvalidArgumentError("headers must be a list of [name, value] pairs");
      metaString(h[0], "header name");
      metaString(h[1], "header value");
    }
  }
  // (Two checks, not a loop over a list: an array literal here was made on every publish.)
  if (meta.utf8 !== undefined && meta.utf8 !== true) throw new InvalidArgumentError("utf8 must be true or absent");
  if (meta.retain !== undefined && meta.retain !== true) throw new InvalidArgumentError("retain must be true or absent");
  if (meta.publisher !== undefined) metaString(meta.publisher, "publisher");
  if (meta.qos !== undefined && meta.qos !== 0 && meta.qos !== 1 && meta.qos !== 2) throw new InvalidArgumentError("qos must be 0, 1 or 2");
}
