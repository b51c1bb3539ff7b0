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

/**
 * The inbox channel of a request that a NATS client published into the
 * tier with a reply subject (`Keyop-Reply-To`): the subject, base64url
 * encoded, so that whichever hub gets the board's reply can publish it
 * to the subject without knowing which hub the request went through.
 */
export function replySubjectInbox(subject: string): string {
  return `${NATS_INBOX}${Buffer.from(subject, "utf8").toString("base64url")}`;
}

/** The NATS subject a tier inbox stands for, or null for any other channel. */
export function inboxReplySubject(inbox: string): string | null {
  if (!inbox.startsWith(NATS_INBOX)) return null;
  const token = inbox.slice(NATS_INBOX.length);
  if (!/^[A-Za-z0-9_-]+$/.test(token)) return null;
  const subject = Buffer.from(token, "base64url").toString("utf8");
  return /^[^\s*>]+$/.test(subject) && !subject.split(".").includes("") ? subject : null;
}

const NATS_INBOX = "_inbox.nats.";
