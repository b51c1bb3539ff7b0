import { describe, expect, test } from "bun:test";
import type { StreamMessage } from "../../src/jetstream/foreign.ts";
import { LiveFeed } from "../../src/jetstream/live-feed.ts";
import { subjectMatcher } from "../../src/jetstream/subjects.ts";

const msg = (seq: number, subject: string): StreamMessage => ({ seq, subject, data: new Uint8Array(), timestampMs: 0, header: () => undefined });

async function drain(t: { next(): Promise<StreamMessage | null> }, n: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) out.push((await t.next())!.seq);
  return out;
}

describe("LiveFeed", () => {
  test("each tap gets the messages its filter matches, exact, prefix.> and with *, in order", async () => {
    const f = new LiveFeed(10, 100);
    const board7 = f.tap("kp.cmd.board-7.>");
    const exact = f.tap("kp.cmd.board-8.reboot");
    const star = f.tap("kp.cmd.*.reboot");
    const all = f.tap("kp.>");
    f.deliver(msg(11, "kp.cmd.board-7.reboot"));
    f.deliver(msg(12, "kp.cmd.board-8.reboot"));
    f.deliver(msg(13, "kp.cmd.board-7.x.y"));
    f.deliver(msg(14, "kp.cmd.board-8.other"));
    expect(await drain(board7, 2)).toEqual([11, 13]);
    expect(await drain(exact, 1)).toEqual([12]);
    expect(await drain(star, 2)).toEqual([11, 12]);
    expect(await drain(all, 4)).toEqual([11, 12, 13, 14]);
    expect(f.taps).toBe(4);
  });

  test("a tap holds from the message after the last the feed delivered", () => {
    const f = new LiveFeed(10, 100);
    expect(f.tap("kp.a.>").from).toBe(11);
    f.deliver(msg(11, "kp.b"));
    expect(f.tap("kp.a.>").from).toBe(12);
  });

  test("a tap that falls more than its limit behind overflows and yields no more; a closed one leaves the feed", async () => {
    const f = new LiveFeed(0, 3);
    const slow = f.tap("kp.a.>");
    for (let i = 1; i <= 4; i++) f.deliver(msg(i, "kp.a.x"));
    expect(slow.overflowed).toBe(true);
    expect(await slow.next()).toBeNull();
    slow.close();
    expect(f.taps).toBe(0);
  });

  test("the feed's end ends every tap, and taps made after it are ended", async () => {
    const f = new LiveFeed(0, 3);
    const t = f.tap("kp.a.>");
    const waiting = t.next();
    f.end();
    expect(await waiting).toBeNull();
    expect(f.tap("kp.b.>").closed).toBe(true);
  });
});

describe("subjectMatcher", () => {
  const cases: [string, string, boolean][] = [
    ["kp.>", "kp.a", true],
    ["kp.>", "kp", false],
    ["kp.*.x", "kp.a.x", true],
    ["kp.*.x", "kp.a.y", false],
    ["kp.a", "kp.a", true],
    ["kp.a", "kp.a.b", false],
  ];
  for (const [f, s, want] of cases) test(`${f} ${want ? "matches" : "does not match"} ${s}`, () => expect(subjectMatcher(f)(s)).toBe(want));
});
