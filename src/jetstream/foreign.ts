/**
 * What a board receives for a stream message. Records that came up through
 * a hub are keyop envelopes already and go down as they are. A message a
 * cloud service published with a plain NATS client is wrapped into an
 * envelope (docs/scale-out.md), with an id derived from the stream and its
 * sequence, so that every hub of the tier gives it the same id and a board
 * that gets it twice (after moving to another hub) drops the second copy.
 */
import { encodeEnvelope, type EnvelopeFields } from "../envelope/envelope.ts";
import { envelopeFromWire, fromJson } from "../envelope/json.ts";
import { channelIs, envelopeId, scanEnvelope, utf8Bytes } from "../envelope/scan.ts";
import { inboxReplySubject, replySubjectInbox, subjectChannel } from "./subjects.ts";

/** A message read from a stream, as the reader needs it. */
export interface StreamMessage {
  subject: string;
  data: Uint8Array;
  /** Stream sequence. */
  seq: number;
  /** When JetStream stored it, epoch ms. */
  timestampMs: number;
  header(name: string): string | undefined;
}

/** What to send for a message, or why it is passed over. */
export type DownRecord = { channel: string; id: string; body: Uint8Array } | { skip: string };

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * A UUIDv7-shaped id from the message's time and its place in the stream:
 * the same on every hub, ordered by time like keyop's own ids.
 */
export function streamMessageId(stream: string, seq: number, timestampMs: number): string {
  const h1 = Bun.hash.wyhash(`${stream}\u0000${seq}`, 1n);
  const h2 = Bun.hash.wyhash(`${stream}\u0000${seq}`, 2n);
  const hex = (v: bigint, digits: number) => v.toString(16).padStart(digits, "0").slice(-digits);
  const ms = BigInt(Math.max(0, Math.floor(timestampMs))) & 0xffff_ffff_ffffn;
  const a = (h1 & 0xfffn) | 0x7000n; // version 7
  const b = ((h2 >> 48n) & 0x3fffn) | 0x8000n; // variant 10
  const c = h2 & 0xffff_ffff_ffffn;
  const t = hex(ms, 12);
  return `${t.slice(0, 8)}-${t.slice(8)}-${hex(a, 4)}-${hex(b, 4)}-${hex(c, 12)}`;
}

/** The record to send for `m` (a stream message under `prefix`); `tier` is the hubs' instance name. */
export function downRecord(m: StreamMessage, o: { prefix: string; stream: string; tier: string; maxBytes: number }): DownRecord {
  const channel = subjectChannel(o.prefix, m.subject);
  if (channel === null) return { skip: `subject ${m.subject} is not a keyop channel under ${o.prefix}` };
  try {
    const view = scanEnvelope(m.data);
    if (channelIs(m.data, view, utf8Bytes(channel))) return { channel, id: envelopeId(m.data, view), body: m.data };
  } catch {
    // not an envelope as keyop stores it: perhaps one stored as JSON (format: json), else a
    // message from a plain NATS client, wrapped below
  }
  const fromText = jsonEnvelope(m.data, channel);
  if (fromText) {
    const body = encodeEnvelope(fromText);
    return body.length > o.maxBytes ? { skip: `message of ${body.length} bytes exceeds the limit of ${o.maxBytes}` } : { channel, id: fromText.id, body };
  }
  const given = m.header("Nats-Msg-Id");
  const id = given !== undefined && UUID.test(given) ? given.toLowerCase() : streamMessageId(o.stream, m.seq, m.timestampMs);
  let payload: unknown = m.data;
  try {
    payload = JSON.parse(utf8.decode(m.data));
  } catch {
    // not JSON text: the bytes as they are
  }
  const correlationId = m.header("Keyop-Correlation-Id");
  const meta = requestMeta(m);
  if ("skip" in meta) return meta;
  const body = encodeEnvelope({
    ...meta,
    id,
    ts: Math.floor(m.timestampMs),
    channel,
    origin: m.header("Keyop-Origin") || "nats",
    type: m.header("Keyop-Type") || "nats",
    correlationId: correlationId || undefined,
    route: [o.tier],
    payload,
  });
  if (body.length > o.maxBytes) return { skip: `message of ${body.length} bytes exceeds the limit of ${o.maxBytes}` };
  return { channel, id, body };
}

/** Requests wait this long for their reply when `Keyop-Ttl-Ms` does not say (ms). */
export const DEFAULT_REQUEST_TTL_MS = 30_000;

/**
 * A NATS client's request: `Keyop-Reply-To` (the subject the reply is
 * published to) and `Keyop-Ttl-Ms` (how long, from when JetStream stored
 * it, the message may still be delivered; for a request also how long its
 * reply is taken).
 */
function requestMeta(m: StreamMessage): { replyTo?: string; expires?: number } | { skip: string } {
  const out: { replyTo?: string; expires?: number } = {};
  const ttl = m.header("Keyop-Ttl-Ms");
  if (ttl !== undefined && ttl !== "") {
    const ms = Number(ttl);
    if (!Number.isSafeInteger(ms) || ms <= 0) return { skip: `header Keyop-Ttl-Ms ${JSON.stringify(ttl)} is not a positive integer` };
    out.expires = Math.floor(m.timestampMs) + ms;
  }
  const replyTo = m.header("Keyop-Reply-To");
  if (replyTo !== undefined && replyTo !== "") {
    const inbox = replySubjectInbox(replyTo);
    if (inboxReplySubject(inbox) !== replyTo) return { skip: `header Keyop-Reply-To ${JSON.stringify(replyTo)} is not a NATS subject` };
    out.replyTo = inbox;
    out.expires ??= Math.floor(m.timestampMs) + DEFAULT_REQUEST_TTL_MS;
  }
  return out;
}

/** The envelope in a stream message stored as the HTTP API's JSON (`format: json`) for `channel`, or null. */
function jsonEnvelope(data: Uint8Array, channel: string): EnvelopeFields | null {
  if (data[0] !== 0x7b) return null; // "{"
  try {
    return envelopeFromWire(fromJson(utf8.decode(data)), channel);
  } catch {
    return null;
  }
}
