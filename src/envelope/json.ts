/**
 * Envelopes as JSON for the HTTP API and the CLI. msgpack payloads may hold
 * raw bytes; in JSON they become `{"$base64": "..."}` so nothing is lost
 * and a reader can tell bytes from text.
 */
import { toWire, type Message } from "./envelope.ts";

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
