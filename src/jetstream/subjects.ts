/**
 * Channels and NATS subjects (docs/scale-out.md): channel `a.b.c` is subject
 * `<prefix>.a.b.c`. Channel tokens ([A-Za-z0-9_-]) are valid subject tokens
 * as they are, and keyop's pattern wildcards (`*`, `>`) mean what NATS's
 * mean, so the mapping is the prefix and nothing else (how patterns relate
 * to each other is envelope/patterns.ts).
 */
import { assertChannel } from "../envelope/names.ts";

/** The subject a channel's records are published to. */
export function channelSubject(prefix: string, channel: string): string {
  return `${prefix}.${channel}`;
}

/** The subject filter of a keyop pattern. */
export function patternSubject(prefix: string, pattern: string): string {
  return `${prefix}.${pattern}`;
}

/** The channel of a subject under `prefix`, or null when it is not one (another prefix, a bad token). */
export function subjectChannel(prefix: string, subject: string): string | null {
  if (!subject.startsWith(`${prefix}.`)) return null;
  const channel = subject.slice(prefix.length + 1);
  try {
    assertChannel(channel);
    return channel;
  } catch {
    return null;
  }
}

/** Whether a subject matches a NATS subject filter (`*` one token, `>` one or more at the end). */
export function subjectMatcher(filter: string): (subject: string) => boolean {
  const f = filter.split(".");
  const tail = f[f.length - 1] === ">";
  const fixed = tail ? f.slice(0, -1) : f;
  return (subject) => {
    const s = subject.split(".");
    if (tail ? s.length <= fixed.length : s.length !== fixed.length) return false;
    for (let i = 0; i < fixed.length; i++) if (fixed[i] !== "*" && fixed[i] !== s[i]) return false;
    return true;
  };
}
