/**
 * How two patterns relate: does one cover the other, do they overlap, what
 * do they both match. Pure functions over validated patterns (names.ts),
 * for checks such as "every peer rule falls in one stream".
 */
import { assertPattern } from "./names.ts";

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
