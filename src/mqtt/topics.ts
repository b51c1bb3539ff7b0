/**
 * MQTT topics and keyop channels are the same names written two ways:
 * `/` separates levels in MQTT and `.` in keyop; the wildcards `+` and `#`
 * are keyop's `*` and `>`. A topic that maps to no valid channel name (an
 * empty level, a `.` inside a level, a `$SYS` topic...) is refused rather
 * than stored under a name nobody could subscribe to.
 */
import { assertChannel, assertPattern } from "../envelope/names.ts";
import { InvalidArgumentError } from "../errors.ts";

/** The channel of an MQTT topic name; throws InvalidArgumentError if there is none. */
export function topicToChannel(topic: string): string {
  if (topic.includes(".")) throw new InvalidArgumentError(`MQTT topic "${topic}" has a "." inside a level`);
  if (topic.includes("+") || topic.includes("#")) throw new InvalidArgumentError(`MQTT topic name "${topic}" may not hold wildcards`);
  const channel = topic.split("/").join(".");
  assertChannel(channel);
  return channel;
}

/** The subscription pattern of an MQTT topic filter; throws InvalidArgumentError if there is none. */
export function filterToPattern(filter: string): string {
  if (filter.includes(".")) throw new InvalidArgumentError(`MQTT topic filter "${filter}" has a "." inside a level`);
  const levels = filter.split("/");
  const mapped = levels.map((l, i) => {
    if (l === "+") return "*";
    if (l === "#") {
      if (i !== levels.length - 1) throw new InvalidArgumentError(`"#" must be the last level of "${filter}"`);
      return ">";
    }
    if (l.includes("+") || l.includes("#")) throw new InvalidArgumentError(`wildcards must fill a whole level in "${filter}"`);
    return l;
  });
  const pattern = mapped.join(".");
  assertPattern(pattern);
  return pattern;
}

/** The MQTT topic name of a channel. */
export function channelToTopic(channel: string): string {
  return channel.split(".").join("/");
}
