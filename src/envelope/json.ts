/**
 * Envelopes as JSON for the HTTP API and the CLI. msgpack payloads may hold
 * raw bytes; in JSON they become `{"$base64": "..."}` so nothing is lost
 * and a reader can tell bytes from text.
 */
import { type EnvelopeFields, readMeta, toWire, type Message } from "./envelope.ts";

/** Walks at most `budget` nodes looking for bytes; true if found (or too big to tell). */
function hasBinary(v: unknown, budget = { n: 2000 }): boolean {
  if (v === null || typeof v !== "object") return false;
  if (v instanceof Uint8Array) return true;
  if (--budget.n < 0) return true;
  const items = Array.isArray(v) ? v : Object.values(v as object);
  for (const x of items) if (typeof x === "object" && x !== null && hasBinary(x, budget)) return true;
  return false;
}

function replacer(this: Record<string, unknown>, key: string, value: unknown): unknown {
  const orig = this[key];
  if (orig instanceof Uint8Array) return { $base64: Buffer.from(orig.buffer, orig.byteOffset, orig.byteLength).toString("base64") };
  return value;
}

/** JSON text of a value, with bytes as `{"$base64": ...}`. */
export function toJson(value: unknown): string {
  return hasBinary(value) ? JSON.stringify(value, replacer) : JSON.stringify(value);
}

/** JSON text of an envelope in the wire form (snake_case, with seq). */
export function envelopeJson(msg: Message): string {
  return toJson(toWire(msg));
}

function reviver(_key: string, value: unknown): unknown {
  if (value !== null && typeof value === "object" && !Array.isArray(value)) {
    const o = value as Record<string, unknown>;
    const keys = Object.keys(o);
    if (keys.length === 1 && keys[0] === "$base64" && typeof o.$base64 === "string") return new Uint8Array(Buffer.from(o.$base64, "base64"));
  }
  return value;
}

/** The value of JSON text written by `toJson`: `{"$base64": ...}` becomes bytes again. */
export function fromJson(text: string): unknown {
  return JSON.parse(text, reviver);
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * The envelope a wire-form object stands for (`envelopeJson` parsed with
 * `fromJson`, or the same map in msgpack): its id, time, origin and route
 * as given. Null when it is not one (`channel`, when given, must be its
 * channel).
 */
export function envelopeFromWire(v: unknown, channel?: string): EnvelopeFields | null {
  if (v === null || typeof v !== "object" || Array.isArray(v)) return null;
  const e = v as Record<string, unknown>;
  const label = (x: unknown) => x === undefined || (typeof x === "string" && x.length > 0);
  if (typeof e.id !== "string" || !UUID.test(e.id) || typeof e.channel !== "string" || (channel !== undefined && e.channel !== channel)) return null;
  if (typeof e.origin !== "string" || typeof e.type !== "string" || e.type === "" || typeof e.ts !== "number" || !Number.isFinite(e.ts)) return null;
  if (!Array.isArray(e.route) || !e.route.every((r) => typeof r === "string") || !label(e.correlation_id) || !label(e.service_name)) return null;
  const out: EnvelopeFields = {
    id: e.id.toLowerCase(),
    ts: e.ts,
    channel: e.channel,
    origin: e.origin,
    type: e.type,
    correlationId: e.correlation_id as string | undefined,
    serviceName: e.service_name as string | undefined,
    route: e.route as string[],
    payload: e.payload === undefined ? null : e.payload,
  };
  readMeta(e, out);
  return out;
}
