/**
 * Channels and NATS subjects (docs/scale-out.md): channel `a.b.c` is subject
 * `<prefix>.a.b.c`. Channel tokens ([A-Za-z0-9_-]) are valid subject tokens
 * as they are, and keyop's pattern wildcards (`*`, `>`) mean what NATS's
 * mean, so the mapping is the prefix and nothing else.
 */
import { assertChannel, assertPattern } from "../envelope/names.ts";

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

/**
 * True when every channel `inner` matches is matched by `outer` (both
 * validated patterns): what a stream must do for a peer's rule, so that no
 * record a peer may send or receive falls outside every stream.
 */
export function patternCovers(outer: string, inner: string): boolean {
  assertPattern(outer);
  assertPattern(inner);
  const o = outer.split(".");
  const i = inner.split(".");
  for (let k = 0; k < o.length; k++) {
    const ot = o[k]!;
    if (ot === ">") return k < i.length; // the rest of inner is one token or more, whatever it is
    const it = i[k];
    if (it === undefined) return false; // inner is shorter: outer needs more tokens
    if (it === ">") return false; // inner reaches any depth, outer has a fixed length here
    if (ot === "*") continue; // one token, literal or `*`
    if (it !== ot) return false; // a literal covers only itself
  }
  return o.length === i.length;
}

/** True when some channel matches both patterns (JetStream refuses two streams that overlap). */
export function patternsOverlap(a: string, b: string): boolean {
  const x = a.split(".");
  const y = b.split(".");
  for (let k = 0; ; k++) {
    const xt = x[k];
    const yt = y[k];
    if (xt === ">" || yt === ">") return (xt === ">" ? y.length : x.length) > k;
    if (xt === undefined || yt === undefined) return xt === yt;
    if (xt !== "*" && yt !== "*" && xt !== yt) return false;
  }
}

/** The rules no single pattern of `covering` covers, in order (each reported once). */
export function uncovered(covering: readonly string[], rules: readonly string[]): string[] {
  const out: string[] = [];
  for (const r of rules) if (!covering.some((c) => patternCovers(c, r)) && !out.includes(r)) out.push(r);
  return out;
}

/** The pattern of the channels both patterns match, or null when none is matched by both. */
export function patternIntersection(a: string, b: string): string | null {
  const x = a.split(".");
  const y = b.split(".");
  const out: string[] = [];
  for (let k = 0; ; k++) {
    const xt = x[k];
    const yt = y[k];
    if (xt === ">") return y.length > k ? [...out, ...y.slice(k)].join(".") : null;
    if (yt === ">") return x.length > k ? [...out, ...x.slice(k)].join(".") : null;
    if (xt === undefined || yt === undefined) return xt === yt ? out.join(".") : null;
    if (xt === "*") out.push(yt);
    else if (yt === "*" || xt === yt) out.push(xt);
    else return null;
  }
}
