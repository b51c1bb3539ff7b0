/**
 * Reading a raw YAML value tree with every problem collected, each with its
 * key path, so that an operator fixes a file in one go (schema.ts and the
 * sections in files of their own use it).
 */
import { assertName, assertPattern } from "../envelope/names.ts";
import { KeyopError } from "../errors.ts";
import { DEFAULT_PRIORITY, HIGHEST_PRIORITY, LOWEST_PRIORITY, type PriorityRule } from "../federation/priority.ts";
import { parseDuration, parseMode, parseSize } from "./units.ts";

/** A YAML mapping as read. */
export type Obj = Record<string, unknown>;

/** Collects problems while reading a raw YAML value tree. */
export class Reader {
  readonly problems: string[] = [];

  fail(path: string, msg: string): undefined {
    this.problems.push(`${path}: ${msg}`);
    return undefined;
  }

  /** An optional mapping with only `keys`; unknown keys are reported. */
  obj(v: unknown, path: string, keys: readonly string[]): Obj | undefined {
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "object" || Array.isArray(v)) return this.fail(path, "must be a mapping");
    for (const k of Object.keys(v)) {
      if (!keys.includes(k)) this.problems.push(`${path ? path + "." : ""}${k}: unknown key (expected one of: ${keys.join(", ")})`);
    }
    return v as Obj;
  }

  /** Reads a required key: "is required" when absent, else whatever `read` says. */
  required<T>(v: unknown, path: string, read: (v: unknown, path: string) => T | undefined, when = ""): T | undefined {
    if (v === undefined || v === null) return this.fail(path, `is required${when}`);
    return read.call(this, v, path);
  }

  str(v: unknown, path: string): string | undefined {
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "string" || v.length === 0) return this.fail(path, "must be a non-empty string");
    return v;
  }

  oneOf<T extends string>(v: unknown, path: string, allowed: readonly T[]): T | undefined {
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "string" || !allowed.includes(v as T)) return this.fail(path, `must be one of ${allowed.join(", ")}`);
    return v as T;
  }

  bool(v: unknown, path: string): boolean | undefined {
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "boolean") return this.fail(path, "must be true or false");
    return v;
  }

  int(v: unknown, path: string, min: number, max = Number.MAX_SAFE_INTEGER): number | undefined {
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) return this.fail(path, `must be an integer from ${min} to ${max}`);
    return v;
  }

  fraction(v: unknown, path: string): number | undefined {
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "number" || !(v >= 0 && v <= 1)) return this.fail(path, "must be a number from 0 to 1");
    return v;
  }

  duration(v: unknown, path: string, minMs = 1): number | undefined {
    if (v === undefined || v === null) return undefined;
    const ms = parseDuration(v);
    if (ms === null || ms < minMs) return this.fail(path, `must be a duration of at least ${minMs} ms (e.g. 500ms, 30s, 7d)`);
    return ms;
  }

  size(v: unknown, path: string, min = 1): number | undefined {
    if (v === undefined || v === null) return undefined;
    const b = parseSize(v);
    if (b === null || b < min) return this.fail(path, `must be a size of at least ${min} bytes (e.g. 4096, 64KiB, 64MiB)`);
    return b;
  }

  mode(v: unknown, path: string): number | undefined {
    if (v === undefined || v === null) return undefined;
    const m = parseMode(v);
    if (m === null) return this.fail(path, "must be an octal file mode such as '0660'");
    return m;
  }

  hostPort(v: unknown, path: string): string | undefined {
    const s = this.str(v, path);
    if (s === undefined) return undefined;
    const m = /^(.+):(\d{1,5})$/.exec(s);
    if (!m || Number(m[2]) > 65535) return this.fail(path, "must be host:port");
    return s;
  }

  /** One host:port, or a non-empty list of them. */
  hostPorts(v: unknown, path: string): string[] | undefined {
    if (!Array.isArray(v)) {
      const one = this.hostPort(v, path);
      return one === undefined ? undefined : [one];
    }
    if (v.length === 0) return this.fail(path, "must be host:port or a non-empty list of them");
    const out = v.map((x, i) => this.hostPort(x, `${path}[${i}]`));
    return out.every((x) => x !== undefined) ? (out as string[]) : undefined;
  }

  patterns(v: unknown, path: string): string[] {
    if (v === undefined || v === null) return [];
    if (!Array.isArray(v)) return this.fail(path, "must be a list of patterns") ?? [];
    const out: string[] = [];
    v.forEach((p, i) => {
      try {
        assertPattern(p);
        out.push(p);
      } catch (err) {
        this.fail(`${path}[${i}]`, err instanceof KeyopError ? err.message : String(err));
      }
    });
    return out;
  }

  /**
   * Channel rules that may name a lane: each entry a pattern, or
   * `{pattern, priority}` (0 the highest, 7 the lowest).
   */
  priorityRules(v: unknown, path: string): PriorityRule[] {
    if (v === undefined || v === null) return [];
    if (!Array.isArray(v)) return this.fail(path, "must be a list of patterns") ?? [];
    const out: PriorityRule[] = [];
    v.forEach((p, i) => {
      const at = `${path}[${i}]`;
      let pattern: unknown = p;
      let priority = DEFAULT_PRIORITY;
      if (p !== null && typeof p === "object" && !Array.isArray(p)) {
        const o = this.obj(p, at, ["pattern", "priority"]);
        if (!o) return;
        pattern = o.pattern;
        const pr = o.priority === undefined ? DEFAULT_PRIORITY : this.int(o.priority, `${at}.priority`, HIGHEST_PRIORITY, LOWEST_PRIORITY);
        if (pr === undefined) return;
        priority = pr;
        if (pattern === undefined) {
          this.fail(`${at}.pattern`, "is required");
          return;
        }
      }
      try {
        assertPattern(pattern);
        out.push({ pattern, priority });
      } catch (err) {
        this.fail(typeof p === "object" ? `${at}.pattern` : at, err instanceof KeyopError ? err.message : String(err));
      }
    });
    return out;
  }

  pattern(v: unknown, path: string): string | undefined {
    if (v === undefined || v === null) return undefined;
    try {
      assertPattern(v);
      return v;
    } catch (err) {
      return this.fail(path, err instanceof KeyopError ? err.message : String(err));
    }
  }

  list(v: unknown, path: string): unknown[] {
    if (v === undefined || v === null) return [];
    if (!Array.isArray(v)) return this.fail(path, "must be a list") ?? [];
    return v;
  }

  name(v: unknown, path: string): string | undefined {
    const s = this.str(v, path);
    if (s === undefined) return undefined;
    try {
      assertName(s, "name");
      return s;
    } catch (err) {
      return this.fail(path, err instanceof KeyopError ? err.message : String(err));
    }
  }
}
