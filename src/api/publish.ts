/**
 * `POST /v1/channels/{channel}/messages`: one JSON message, an NDJSON batch
 * (one message per line) or msgpack (one map, or an array of maps). The
 * answer comes only after the durable write; a batch is validated whole
 * before anything is stored.
 */
import { Packr } from "msgpackr";
import { BadRequestError, KeyopError } from "../errors.ts";
import type { BatchEntry, Messenger, PublishOptions, PublishResult } from "../messenger/messenger.ts";
import { json, mediaType, readBody } from "./http.ts";

const FIELDS = new Set(["type", "payload", "correlation_id", "correlation_data", "service_name", "ttl_ms"]);
const utf8 = new TextDecoder("utf-8", { fatal: true });
const msgpack = new Packr({ useRecords: false, mapsAsObjects: true });

/** Limits applied to publish bodies. */
export interface PublishLimits {
  /** Largest body of a single-message publish. */
  maxMessageBytes: number;
  /** Largest body of a batch (NDJSON or msgpack array). */
  maxBatchBytes: number;
}

const JSON_TYPES = new Set(["", "application/json", "text/json"]);
const NDJSON_TYPES = new Set(["application/x-ndjson", "application/ndjson", "application/jsonl", "application/jsonlines"]);
const MSGPACK_TYPES = new Set(["application/msgpack", "application/x-msgpack", "application/vnd.msgpack"]);

/** Turns one decoded message object into a batch entry, or throws 400 naming `where`. */
function entryOf(channel: string, o: unknown, where: string): BatchEntry {
  if (o === null || typeof o !== "object" || Array.isArray(o)) throw new BadRequestError(`${where}: a message must be a JSON object with "type" and "payload"`);
  const m = o as Record<string, unknown>;
  for (const k of Object.keys(m)) if (!FIELDS.has(k)) throw new BadRequestError(`${where}: unknown field "${k}" (expected type, payload, correlation_id, correlation_data, service_name, ttl_ms)`);
  if (typeof m.type !== "string" || m.type.length === 0) throw new BadRequestError(`${where}: "type" is required and must be a non-empty string`);
  const opts: PublishOptions = {};
  if (m.correlation_id !== undefined) {
    if (typeof m.correlation_id !== "string") throw new BadRequestError(`${where}: "correlation_id" must be a string`);
    opts.correlationId = m.correlation_id;
  }
  // The bytes an MQTT 5 requester expects back with its reply, as its request's envelope showed them.
  if (m.correlation_data !== undefined) opts.meta = { correlationData: correlationData(m.correlation_data, where) };
  if (m.service_name !== undefined) {
    if (typeof m.service_name !== "string") throw new BadRequestError(`${where}: "service_name" must be a string`);
    opts.serviceName = m.service_name;
  }
  if (m.ttl_ms !== undefined) {
    if (typeof m.ttl_ms !== "number" || !Number.isSafeInteger(m.ttl_ms) || m.ttl_ms <= 0) throw new BadRequestError(`${where}: "ttl_ms" must be a positive integer (milliseconds)`);
    opts.ttlMs = m.ttl_ms;
  }
  return { channel, type: m.type, payload: m.payload === undefined ? null : m.payload, opts };
}

/** `correlation_data` as `{"$base64": "..."}` (how envelopes show bytes), a UTF-8 string, or msgpack bytes. */
function correlationData(v: unknown, where: string): Uint8Array {
  if (v instanceof Uint8Array) return v;
  if (typeof v === "string") return new TextEncoder().encode(v);
  const b64 = v !== null && typeof v === "object" ? (v as { $base64?: unknown }).$base64 : undefined;
  if (typeof b64 !== "string" || Object.keys(v as object).length !== 1 || !/^[A-Za-z0-9+/]*={0,2}$/.test(b64)) {
    throw new BadRequestError(`${where}: "correlation_data" must be a string or {"$base64": "..."}`);
  }
  return new Uint8Array(Buffer.from(b64, "base64"));
}

function text(body: Uint8Array): string {
  try {
    return utf8.decode(body);
  } catch {
    throw new BadRequestError("body is not valid UTF-8");
  }
}

function parseJson(s: string, where: string): unknown {
  try {
    return JSON.parse(s);
  } catch (err) {
    throw new BadRequestError(`${where}: invalid JSON: ${err instanceof Error ? err.message : String(err)}`);
  }
}

const wire = (r: PublishResult) => ({ id: r.id, channel: r.channel, seq: r.seq, ts: r.ts });

/** One JSON message from a request body (`type`, `payload`, ...), for a single publish or a request. */
export async function singleMessage(req: Request, channel: string, limits: PublishLimits): Promise<BatchEntry> {
  const type = mediaType(req);
  if (!JSON_TYPES.has(type)) throw new KeyopError("unsupported_media_type", `content type "${type}" is not accepted here: use application/json`);
  const body = await readBody(req, limits.maxMessageBytes);
  return entryOf(channel, parseJson(text(body), "body"), "body");
}

/** Handles a publish request for `channel` (already validated as a channel name). */
export async function handlePublish(req: Request, channel: string, messenger: Messenger, limits: PublishLimits): Promise<Response> {
  const type = mediaType(req);
  if (JSON_TYPES.has(type)) {
    const body = await readBody(req, limits.maxMessageBytes);
    const entry = entryOf(channel, parseJson(text(body), "body"), "body");
    return json(201, wire(await messenger.publish(channel, entry.type, entry.payload, entry.opts)));
  }
  if (NDJSON_TYPES.has(type)) {
    const body = text(await readBody(req, limits.maxBatchBytes));
    const entries: BatchEntry[] = [];
    body.split("\n").forEach((line, i) => {
      if (line.trim() === "") return;
      entries.push(entryOf(channel, parseJson(line, `line ${i + 1}`), `line ${i + 1}`));
    });
    if (entries.length === 0) throw new BadRequestError("NDJSON body holds no message");
    return json(201, { results: (await messenger.publishBatch(entries)).map(wire) });
  }
  if (MSGPACK_TYPES.has(type)) {
    const body = await readBody(req, limits.maxBatchBytes);
    let decoded: unknown;
    try {
      decoded = msgpack.unpack(body);
    } catch (err) {
      throw new BadRequestError(`invalid msgpack: ${err instanceof Error ? err.message : String(err)}`);
    }
    if (Array.isArray(decoded)) {
      if (decoded.length === 0) throw new BadRequestError("msgpack array holds no message");
      const entries = decoded.map((o, i) => entryOf(channel, o, `item ${i}`));
      return json(201, { results: (await messenger.publishBatch(entries)).map(wire) });
    }
    if (body.length > limits.maxMessageBytes) throw new KeyopError("too_large", `message body of ${body.length} bytes exceeds ${limits.maxMessageBytes}`);
    const entry = entryOf(channel, decoded, "body");
    return json(201, wire(await messenger.publish(channel, entry.type, entry.payload, entry.opts)));
  }
  throw new KeyopError("unsupported_media_type", `content type "${type}" is not accepted: use application/json, application/x-ndjson or application/msgpack`);
}
