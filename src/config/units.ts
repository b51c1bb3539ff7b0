/**
 * Durations and sizes as operators write them in YAML (docs/config.md):
 * `500ms`, `30s`, `5m`, `12h`, `7d`; `512`, `64KiB`, `64MiB`, `1GiB`, `10MB`.
 * A bare number is milliseconds or bytes.
 */

const DURATION: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };
const SIZE: Record<string, number> = {
  b: 1,
  kb: 1000,
  mb: 1000 ** 2,
  gb: 1000 ** 3,
  kib: 1024,
  mib: 1024 ** 2,
  gib: 1024 ** 3,
  k: 1024,
  m: 1024 ** 2,
  g: 1024 ** 3,
};

/** Milliseconds of a duration, or null when `v` is not one. */
export function parseDuration(v: unknown): number | null {
  if (typeof v === "number") return Number.isFinite(v) && v >= 0 ? v : null;
  if (typeof v !== "string") return null;
  const m = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$/.exec(v);
  if (!m) return null;
  return Number(m[1]) * DURATION[m[2] ?? "ms"]!;
}

/** Bytes of a size, or null when `v` is not one. */
export function parseSize(v: unknown): number | null {
  if (typeof v === "number") return Number.isInteger(v) && v >= 0 ? v : null;
  if (typeof v !== "string") return null;
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)?\s*$/.exec(v);
  if (!m) return null;
  const unit = SIZE[(m[2] ?? "b").toLowerCase()];
  return unit === undefined ? null : Math.round(Number(m[1]) * unit);
}

/**
 * A file mode written as octal digits: `0660`, `"0660"`, `660` (YAML 1.2
 * reads an unquoted 0660 as the decimal number 660, so digits are octal).
 */
export function parseMode(v: unknown): number | null {
  const s = typeof v === "number" && Number.isInteger(v) ? String(v) : typeof v === "string" ? v.trim().replace(/^0o/, "") : null;
  if (s === null || !/^[0-7]{1,4}$/.test(s)) return null;
  const mode = parseInt(s, 8);
  return mode <= 0o7777 ? mode : null;
}
