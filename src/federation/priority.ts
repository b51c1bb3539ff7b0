/**
 * Priority lanes of a link (docs/federation.md): each publish rule of a
 * link (and each subscribe rule of a hub's peer) may name a priority, 0
 * the highest; a channel takes the priority of the first rule that matches
 * it. The lanes share the link by weight, so a higher lane overtakes a
 * backlog and a lower one still gets its share.
 */
import { compilePattern } from "../envelope/names.ts";

/** The highest priority. */
export const HIGHEST_PRIORITY = 0;
/** The lowest priority. */
export const LOWEST_PRIORITY = 7;
/** What a rule without a priority gets: below an alarm lane, above bulk uploads. */
export const DEFAULT_PRIORITY = 4;

/** A channel pattern with the lane its channels go in. */
export interface PriorityRule {
  pattern: string;
  priority: number;
}

/**
 * A lane's share of the link when every lane has something to send: each
 * step up doubles it, so priority 0 gets 16 times the bytes of the default
 * lane and 128 times those of the lowest.
 */
export function laneWeight(priority: number): number {
  return 2 ** (LOWEST_PRIORITY - priority);
}

/** The lane of a channel: the priority of the first rule that matches it, else the default. */
export function compilePriorities(rules: readonly PriorityRule[]): (channel: string) => number {
  const distinct = new Set(rules.map((r) => r.priority));
  if (rules.length === 0 || (distinct.size === 1 && distinct.has(DEFAULT_PRIORITY))) return () => DEFAULT_PRIORITY;
  const compiled = rules.map((r) => ({ match: compilePattern(r.pattern), priority: r.priority }));
  return (channel) => {
    for (const r of compiled) if (r.match(channel)) return r.priority;
    return DEFAULT_PRIORITY;
  };
}
