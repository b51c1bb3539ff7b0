/**
 * Structured logging: one line per event on stderr, JSON or text.
 *
 * A plain object with four methods, passed in where needed, so libraries
 * embedding keyop can route events to their own logger.
 */

/** Severity, in increasing order. */
export type LogLevel = "debug" | "info" | "warn" | "error";
/** Line format: JSON for machines, text for people at a terminal. */
export type LogFormat = "json" | "text";
/** Extra key/value pairs of one event. */
export type LogFields = Record<string, unknown>;

/** The logging surface every keyop component takes. */
export interface Logger {
  debug(msg: string, fields?: LogFields): void;
  info(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  error(msg: string, fields?: LogFields): void;
  /** Changes the lowest level written (a configuration reload); loggers that cannot, ignore it. */
  setLevel?(level: LogLevel): void;
}

const RANK: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

/** True for the four level names (config validation). */
export function isLogLevel(v: unknown): v is LogLevel {
  return typeof v === "string" && v in RANK;
}

/** Options of `createLogger`. */
export interface LoggerOptions {
  level?: LogLevel;
  format?: LogFormat;
  /** Where lines go; stderr by default. */
  write?: (line: string) => void;
  /** Fields added to every line (e.g. the instance name). */
  base?: LogFields;
}

/** A logger that writes one line per event at or above `level`. */
export function createLogger(opts: LoggerOptions = {}): Logger {
  let min = RANK[opts.level ?? "info"];
  const format = opts.format ?? "json";
  const write = opts.write ?? ((line: string) => process.stderr.write(line + "\n"));
  const base = opts.base ?? {};
  const emit = (level: LogLevel, msg: string, fields?: LogFields) => {
    if (RANK[level] < min) return;
    const time = new Date().toISOString();
    if (format === "json") {
      write(JSON.stringify({ time, level, msg, ...base, ...fields }));
      return;
    }
    const kv = Object.entries({ ...base, ...fields })
      .map(([k, v]) => `${k}=${typeof v === "string" && !/\s/.test(v) ? v : JSON.stringify(v)}`)
      .join(" ");
    write(`${time} ${level.toUpperCase().padEnd(5)} ${msg}${kv ? " " + kv : ""}`);
  };
  return {
    debug: (m, f) => emit("debug", m, f),
    info: (m, f) => emit("info", m, f),
    warn: (m, f) => emit("warn", m, f),
    error: (m, f) => emit("error", m, f),
    setLevel: (level) => {
      min = RANK[level];
    },
  };
}

/** A logger that drops everything (tests, benchmarks). */
export const silentLogger: Logger = { debug() {}, info() {}, warn() {}, error() {} };
