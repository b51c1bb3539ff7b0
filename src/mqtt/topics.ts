/**
 * MQTT topics and keyop channels (docs/mqtt.md, "Topics"): `/` separates
 * levels in MQTT and `.` in keyop, and `+` and `#` are keyop's `*` and `>`.
 * A level that is a channel token as it is (`[A-Za-z0-9_-]+`, not starting
 * with `--`) stays as it is, so `sensors/kitchen/temp` is still
 * `sensors.kitchen.temp`. Any other level (empty, with `.`, spaces, `$`,
 * any UTF-8) becomes `--` and the hex of its UTF-8: `/TopicA` is
 * `--.TopicA`, `a//b` is `a.--.b`. No plain token starts with `--`, so the
 * mapping is injective and every topic comes back unchanged, across
 * federation too. A last level `dead-letter` is escaped as well: channels
 * ending so are keyop's own dead letters.
 */
import { assertChannel, assertPattern, DEAD_LETTER_SUFFIX } from "../envelope/names.ts";
import { InvalidArgumentError } from "../errors.ts";

const TOKEN = /^[A-Za-z0-9_-]+$/;
const ESCAPE = "--";
const DEAD = DEAD_LETTER_SUFFIX.slice(1);
const utf8 = new TextEncoder();
const fromUtf8 = new TextDecoder("utf-8", { fatal: true });

/** The channel token of one topic level. */
export function levelToken(level: string, last: boolean): string {
  if (TOKEN.test(level) && !level.startsWith(ESCAPE) && !(last && level === DEAD)) return level;
  return ESCAPE + Buffer.from(utf8.encode(level)).toString("hex");
}

/** The topic level of one channel token. */
export function tokenLevel(token: string): string {
  if (!token.startsWith(ESCAPE)) return token;
  const hex = token.slice(ESCAPE.length);
  if (!/^(?:[0-9a-f]{2})*$/.test(hex)) return token; // not made by levelToken: shown as it is
  try {
    return fromUtf8.decode(Buffer.from(hex, "hex"));
  } catch {
    return token;
  }
}

/** The channel of an MQTT topic name; throws InvalidArgumentError (or InvalidChannelError: too long) if there is none. */
export function topicToChannel(topic: string): string {
  if (topic.length === 0) throw new InvalidArgumentError("an MQTT topic name may not be empty");
  if (topic.includes("+") || topic.includes("#")) throw new InvalidArgumentError(`MQTT topic name "${topic}" may not hold wildcards`);
  if (topic.includes("\u0000")) throw new InvalidArgumentError("an MQTT topic may not hold U+0000");
  if (topic.startsWith("$SYS")) throw new InvalidArgumentError(`"${topic}": $SYS topics are the broker's`);
  const levels = topic.split("/");
  const channel = levels.map((l, i) => levelToken(l, i === levels.length - 1)).join(".");
  assertChannel(channel);
  return channel;
}

/** The subscription pattern of an MQTT topic filter; throws InvalidArgumentError (or InvalidPatternError) if there is none. */
export function filterToPattern(filter: string): string {
  if (filter.length === 0) throw new InvalidArgumentError("an MQTT topic filter may not be empty");
  if (filter.includes("\u0000")) throw new InvalidArgumentError("an MQTT topic filter may not hold U+0000");
  const levels = filter.split("/");
  const mapped = levels.map((l, i) => {
    if (l === "+") return "*";
    if (l === "#") {
      if (i !== levels.length - 1) throw new InvalidArgumentError(`"#" must be the last level of "${filter}"`);
      return ">";
    }
    if (l.includes("+") || l.includes("#")) throw new InvalidArgumentError(`wildcards must fill a whole level in "${filter}"`);
    return levelToken(l, i === levels.length - 1);
  });
  const pattern = mapped.join(".");
  assertPattern(pattern);
  return pattern;
}

/**
 * The patterns a filter subscribes to: its own, and for a filter ending in
 * `/#` also its parent's, since MQTT's `sport/#` matches `sport` itself and
 * keyop's `sport.>` does not.
 */
export function filterToPatterns(filter: string): string[] {
  const pattern = filterToPattern(filter);
  const parent = filter.endsWith("/#") ? filter.slice(0, -2) : "";
  // (Mapped as a filter of its own: its last level is then the last one, as in the topic.)
  return parent === "" ? [pattern] : [pattern, filterToPattern(parent)];
}

/** The MQTT topic name of a channel. */
export function channelToTopic(channel: string): string {
  // Only a token starting with `--` is escaped; most channels have none (a cost per delivery).
  if (!channel.startsWith(ESCAPE) && !channel.includes(`.${ESCAPE}`)) return channel.replaceAll(".", "/");
  return channel.split(".").map(tokenLevel).join("/");
}

/**
 * Whether a subscription of `pattern` must not get `channel`: a filter that
 * starts with a wildcard never matches a topic starting with `$`
 * (MQTT-4.7.2-1), though the pattern it maps to matches its channel.
 */
export function hiddenFromWildcard(pattern: string, channel: string): boolean {
  const c = pattern.charCodeAt(0);
  // A first token of "*" or ">" (0x2a, 0x3e), then the end or a ".".
  if ((c !== 0x2a && c !== 0x3e) || (pattern.length > 1 && pattern.charCodeAt(1) !== 0x2e)) return false;
  if (!channel.startsWith(`${ESCAPE}24`)) return false;
  const dot = channel.indexOf(".");
  return tokenLevel(dot < 0 ? channel : channel.slice(0, dot)).startsWith("$");
}
