/**
 * HTTP plumbing of the local API: error codes to status codes, the JSON
 * error body of docs/api.md, reading a body with a byte limit (checked before
 * and while reading), and query parameters with typed errors.
 */
import { BadRequestError, KeyopError, TooLargeError, type ErrorCode } from "../errors.ts";
import type { StartFrom } from "../store/cursor-store.ts";

const STATUS: Partial<Record<ErrorCode, number>> = {
  invalid_channel: 400,
  invalid_pattern: 400,
  invalid_name: 400,
  reserved_channel: 400,
  invalid_argument: 400,
  decode_failed: 400,
  bad_request: 400,
  too_large: 413,
  unsupported_media_type: 415,
  unknown_subscriber: 404,
  unknown_channel: 404,
  not_found: 404,
  method_not_allowed: 405,
  disk_full: 507,
  buffer_full: 507,
  timeout: 504,
  no_responders: 503,
  no_request: 404,
  unreachable: 503,
  log_unavailable: 503,
  unavailable: 503,
  closed: 503,
  shutting_down: 503,
  forbidden: 403,
  conflict: 409,
};

/**
 * A JSON response (`application/json;charset=utf-8`). `Response.json` with
 * a bare status: a headers object given as an init is turned into a new
 * Headers for every response, which cost each publish about as much as its
 * JSON.
 */
export function json(status: number, body: unknown): Response {
  return Response.json(body, status);
}

/** `{"error":{"code","message"}}` with the given status. */
export function errorBody(status: number, code: string, message: string): Response {
  return json(status, { error: { code, message } });
}

/** The response for anything thrown while handling a request. */
export function errorResponse(err: unknown): Response {
  if (err instanceof KeyopError) return errorBody(STATUS[err.code] ?? 500, err.code, err.message);
  return errorBody(500, "internal", err instanceof Error ? err.message : String(err));
}

/** HTTP status of an error, for logs and metrics. */
export function statusOf(err: unknown): number {
  return err instanceof KeyopError ? (STATUS[err.code] ?? 500) : 500;
}

/** Reads the whole body, failing with 413 as soon as it passes `limit` bytes. */
export async function readBody(req: Request, limit: number): Promise<Uint8Array> {
  const declared = Number(req.headers.get("content-length") ?? NaN);
  if (declared > limit) throw new TooLargeError(`body of ${declared} bytes exceeds the limit of ${limit}`);
  if (Number.isFinite(declared)) {
    // Length known and within the limit: one read, far cheaper than iterating the stream.
    return await req.bytes();
  }
  if (!req.body) return new Uint8Array(0);
  const chunks: Uint8Array[] = [];
  let total = 0;
  for await (const chunk of req.body as AsyncIterable<Uint8Array>) {
    total += chunk.length;
    if (total > limit) throw new TooLargeError(`body exceeds the limit of ${limit} bytes`);
    chunks.push(chunk);
  }
  if (chunks.length === 1) return chunks[0]!;
  const out = new Uint8Array(total);
  let off = 0;
  for (const c of chunks) {
    out.set(c, off);
    off += c.length;
  }
  return out;
}

/** An integer query parameter within [min, max], or `def` when absent. */
export function intParam(url: URL, name: string, def: number, min: number, max: number): number {
  const v = url.searchParams.get(name);
  if (v === null || v === "") return def;
  if (!/^\d+$/.test(v)) throw new BadRequestError(`query parameter ${name} must be an integer`);
  const n = Number(v);
  if (n < min || n > max) throw new BadRequestError(`query parameter ${name} must be from ${min} to ${max}`);
  return n;
}

/** `from=earliest|latest|<seq>`, or undefined when absent. */
export function fromParam(url: URL): StartFrom | undefined {
  const v = url.searchParams.get("from");
  if (v === null || v === "") return undefined;
  if (v === "earliest" || v === "latest") return v;
  if (/^\d+$/.test(v) && Number(v) >= 1) return Number(v);
  throw new BadRequestError("query parameter from must be earliest, latest or a seq >= 1");
}

/** A required string query parameter. */
export function requiredParam(url: URL, name: string): string {
  const v = url.searchParams.get(name);
  if (!v) throw new BadRequestError(`query parameter ${name} is required`);
  return v;
}

/** True for `true`, `1`, `yes`. */
export function boolParam(url: URL, name: string): boolean {
  const v = url.searchParams.get(name);
  return v === "true" || v === "1" || v === "yes";
}

/** The media type of the request without parameters, lower-cased. */
export function mediaType(req: Request): string {
  return (req.headers.get("content-type") ?? "").split(";")[0]!.trim().toLowerCase();
}
