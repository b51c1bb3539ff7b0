import { describe, expect, test } from "bun:test";
import { channelSubject, inboxReplySubject, patternSubject, replySubjectInbox, subjectChannel } from "../../src/jetstream/subjects.ts";
import { assertChannel } from "../../src/envelope/names.ts";

describe("channel and subject", () => {
  test("a channel is its subject under the prefix, and back", () => {
    expect(channelSubject("kp", "telemetry.board-7.temp")).toBe("kp.telemetry.board-7.temp");
    expect(subjectChannel("kp", "kp.telemetry.board-7.temp")).toBe("telemetry.board-7.temp");
    expect(patternSubject("kp", "cmd.*.>")).toBe("kp.cmd.*.>");
  });
  test("subjects outside the prefix or with tokens a channel cannot hold are not channels", () => {
    expect(subjectChannel("kp", "other.a")).toBeNull();
    expect(subjectChannel("kp", "kpx.a")).toBeNull();
    expect(subjectChannel("kp", "kp.")).toBeNull();
    expect(subjectChannel("kp", "kp.a..b")).toBeNull();
    expect(subjectChannel("kp", "kp.a.$b")).toBeNull();
  });
});

describe("reply subjects", () => {
  test("a NATS reply subject is an inbox channel and back; other channels are not reply subjects", () => {
    for (const subject of ["_INBOX.abcdef.1", "replies.svc-1", "a"]) {
      const inbox = replySubjectInbox(subject);
      expect(() => assertChannel(inbox)).not.toThrow();
      expect(inbox.startsWith("_inbox.nats.")).toBe(true);
      expect(inboxReplySubject(inbox)).toBe(subject);
    }
    expect(inboxReplySubject("_inbox.0192f0a0-0000-7000-8000-000000000000")).toBeNull();
    expect(inboxReplySubject("cmd.board")).toBeNull();
    expect(inboxReplySubject(`_inbox.nats.${Buffer.from("a b").toString("base64url")}`)).toBeNull();
  });
});
