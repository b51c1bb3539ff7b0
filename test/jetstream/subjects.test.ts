import { describe, expect, test } from "bun:test";
import { channelSubject, patternSubject, subjectChannel } from "../../src/jetstream/subjects.ts";

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
