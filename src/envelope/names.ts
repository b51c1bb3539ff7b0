/**
 * Channel names, patterns and subscriber names (docs/api.md, "Names").
 *
 * Channel names become directory names, so validation here is also the guard
 * that keeps every file keyop writes inside its data directory.
 */
import { InvalidChannelError, InvalidNameError, InvalidPatternError } from "../errors.ts";

/** Longest channel name or pattern in bytes. */
export const MAX_CHANNEL_BYTES = 255;
/** Longest subscriber name in bytes. */
export const MAX_SUBSCRIBER_NAME_BYTES = 128;
/** Suffix of the channel that receives a channel's dead letters. */
export const DEAD_LETTER_SUFFIX = ".dead-letter";

const TOKEN = /^[A-Za-z0-9_-]+$/;
const NAME = /^[A-Za-z0-9_.-]+$/;
const valid = new Set<string>();

/**
 * Throws `InvalidChannelError` unless `name` is a channel name. Names seen
 * valid are remembered (bounded) so the publish hot path pays once per name.
 */
export function assertChannel(name: unknown): asserts name is string {
  if (!isChannel(name)) throw new InvalidChannelError(channelProblem(name)!);
}

/** True when `name` is a channel name; remembered like `assertChannel`'s. */
export function isChannel(name: unknown): name is string {
  if (typeof name === "string" && valid.has(name)) return true;
  if (channelProblem(name) !== null) return false;
  if (valid.size > 10_000) valid.clear();
  valid.add(name as string);
  return true;
}

/** Returns why `name` is not a channel name, or null when it is one. */
export function channelProblem(name: unknown): string | null {
  if (typeof name !== "string") return "channel name must be a string";
  if (name.length === 0) return "channel name is empty";
  if (name.length > MAX_CHANNEL_BYTES) return `channel name longer than ${MAX_CHANNEL_BYTES} bytes`;
  for (const token of name.split(".")) {
    if (token.length === 0) return `channel "${printable(name)}" has an empty token`;
    if (!TOKEN.test(token)) {
      return `channel "${printable(name)}" has a token outside [A-Za-z0-9_-]: "${printable(token)}"`;
    }
  }
  return null;
}

/** True for `<channel>.dead-letter` names, which only keyop itself writes. */
export function isDeadLetter(channel: string): boolean {
  return channel.endsWith(DEAD_LETTER_SUFFIX);
}

/** The dead-letter channel of `channel`. */
export function deadLetterOf(channel: string): string {
  return channel + DEAD_LETTER_SUFFIX;
}

/** True when the pattern holds `*` or `>` and so may match many channels. */
export function isWildcard(pattern: string): boolean {
  return pattern === ">" || pattern.split(".").some((t) => t === "*" || t === ">");
}

/** Throws `InvalidPatternError` unless `pattern` is a valid pattern. */
export function assertPattern(pattern: unknown): asserts pattern is string {
  if (typeof pattern !== "string") throw new InvalidPatternError("pattern must be a string");
  if (pattern.length === 0) throw new InvalidPatternError("pattern is empty");
  if (pattern.length > MAX_CHANNEL_BYTES) {
    throw new InvalidPatternError(`pattern longer than ${MAX_CHANNEL_BYTES} bytes`);
  }
  const tokens = pattern.split(".");
  tokens.forEach((token, i) => {
    if (token === "*") return;
    if (token === ">") {
      if (i !== tokens.length - 1) {
        throw new InvalidPatternError(`pattern "${printable(pattern)}": ">" must be the last token`);
      }
      return;
    }
    if (token.length === 0) throw new InvalidPatternError(`pattern "${printable(pattern)}" has an empty token`);
    if (!TOKEN.test(token)) {
      throw new InvalidPatternError(`pattern "${printable(pattern)}" has an invalid token "${printable(token)}"`);
    }
  });
}

/** A compiled pattern: cheap to test against many channel names. */
export type Matcher = (channel: string) => boolean;

/**
 * Compiles a validated pattern. Wildcards do not match `.dead-letter`
 * channels unless the pattern's last token is `dead-letter` itself, so a
 * catch-all subscriber never feeds on (and re-dead-letters) its own failures.
 */
export function compilePattern(pattern: string): Matcher {
  assertPattern(pattern);
  if (!isWildcard(pattern)) return (channel) => channel === pattern;
  const tokens = pattern.split(".");
  const wantsDeadLetters = tokens[tokens.length - 1] === "dead-letter";
  const tail = tokens[tokens.length - 1] === ">";
  const fixed = tail ? tokens.slice(0, -1) : tokens;
  return (channel) => {
    if (!wantsDeadLetters && isDeadLetter(channel)) return false;
    const parts = channel.split(".");
    if (tail ? parts.length <= fixed.length : parts.length !== fixed.length) return false;
    for (let i = 0; i < fixed.length; i++) {
      if (fixed[i] !== "*" && fixed[i] !== parts[i]) return false;
    }
    return true;
  };
}

/**
 * Allow rules (a peer's or a user's publish or subscribe list) as one
 * matcher: true when any of the patterns matches. No patterns allow nothing.
 */
export function compileRules(patterns: readonly string[]): Matcher {
  const matchers = patterns.map(compilePattern);
  if (matchers.length === 1) return matchers[0]!;
  return (channel) => {
    for (const m of matchers) if (m(channel)) return true;
    return false;
  };
}

/** Throws `InvalidNameError` unless `name` can name a subscriber (or instance). */
export function assertName(name: unknown, what = "subscriber name"): asserts name is string {
  if (typeof name !== "string" || name.length === 0) throw new InvalidNameError(`${what} is empty`);
  if (name.length > MAX_SUBSCRIBER_NAME_BYTES) {
    throw new InvalidNameError(`${what} longer than ${MAX_SUBSCRIBER_NAME_BYTES} bytes`);
  }
  if (!NAME.test(name) || name === "." || name === "..") {
    throw new InvalidNameError(`${what} "${printable(name)}" must use only [A-Za-z0-9_.-]`);
  }
}

function printable(s: string): string {
  const cut = s.length > 64 ? s.slice(0, 64) + "…" : s;
  return cut.replace(/[^\x20-\x7e]/g, "?");
}
