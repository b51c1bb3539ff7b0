/**
 * Command-line parsing for the `keyop` subcommands: `--flag value`,
 * `--flag=value`, boolean and repeatable flags, positionals. Anything
 * unexpected is a `UsageError` (exit code 2, one line on stderr).
 */

/** A wrong command line: the CLI prints it and exits 2. */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "UsageError";
  }
}

/** How one flag is read. */
export type FlagKind = "string" | "boolean" | "multi";

/** Parsed command line. */
export interface Parsed {
  flags: Record<string, string | boolean | string[] | undefined>;
  positionals: string[];
  help: boolean;
}

/** Parses `argv` against `spec` (flag name without dashes -> kind). */
export function parseArgs(argv: readonly string[], spec: Record<string, FlagKind>, maxPositionals: number): Parsed {
  const flags: Parsed["flags"] = {};
  const positionals: string[] = [];
  let help = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === "--help" || a === "-h") {
      help = true;
      continue;
    }
    if (a === "--") {
      positionals.push(...argv.slice(i + 1));
      break;
    }
    if (a.startsWith("--")) {
      const eq = a.indexOf("=");
      const name = eq > 0 ? a.slice(2, eq) : a.slice(2);
      const kind = spec[name];
      if (!kind) throw new UsageError(`unknown option --${name}`);
      if (kind === "boolean") {
        if (eq > 0) throw new UsageError(`--${name} takes no value`);
        flags[name] = true;
        continue;
      }
      const value: string | undefined = eq > 0 ? a.slice(eq + 1) : argv[++i];
      if (value === undefined) throw new UsageError(`--${name} needs a value`);
      if (kind === "multi") flags[name] = [...((flags[name] as string[] | undefined) ?? []), value];
      else flags[name] = value;
      continue;
    }
    if (a.startsWith("-") && a !== "-") throw new UsageError(`unknown option ${a}`);
    positionals.push(a);
  }
  if (!help && positionals.length > maxPositionals) throw new UsageError(`unexpected argument "${positionals[maxPositionals]}"`);
  return { flags, positionals, help };
}

/** A flag as a positive integer, or `def`. */
export function intFlag(p: Parsed, name: string, def: number | undefined, min = 1): number | undefined {
  const v = p.flags[name];
  if (v === undefined) return def;
  if (typeof v !== "string" || !/^\d+$/.test(v) || Number(v) < min) throw new UsageError(`--${name} must be an integer >= ${min}`);
  return Number(v);
}

/** `--from earliest|latest|SEQ`. */
export function fromFlag(p: Parsed): "earliest" | "latest" | number | undefined {
  const v = p.flags.from;
  if (v === undefined) return undefined;
  if (v === "earliest" || v === "latest") return v;
  if (typeof v === "string" && /^\d+$/.test(v) && Number(v) >= 1) return Number(v);
  throw new UsageError("--from must be earliest, latest or a seq >= 1");
}
