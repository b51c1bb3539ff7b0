import { describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { SentMarks } from "../../src/mqtt/sent-marks.ts";
import { tmpDir } from "../helpers.ts";

const logEnds = new Map([["t.a", 10]]);

describe("SentMarks", () => {
  test("after a clean close, a restart knows exactly what each client got", async () => {
    const dir = join(tmpDir(), "marks");
    const m = await SentMarks.open(dir, new Map());
    m.sending("c1", "t.a", 3);
    m.sending("c1", "t.a", 2); // a lower seq never moves the mark back
    expect(m.sentBefore("c1", "t.a", 3)).toBe(true);
    expect(m.sentBefore("c1", "t.a", 4)).toBe(false);
    await m.close();
    const again = await SentMarks.open(dir, logEnds);
    expect([1, 3, 4, 10].map((s) => again.sentBefore("c1", "t.a", s))).toEqual([true, true, false, false]);
    expect(again.sentBefore("c2", "t.a", 1)).toBe(false);
    await again.close();
  });

  test("after a crash, everything already in the log when keyop started counts as maybe sent", async () => {
    const dir = join(tmpDir(), "marks");
    const m = await SentMarks.open(dir, new Map());
    m.sending("c1", "t.a", 3);
    // No close: the file on disk still says the run is going on.
    const after = await SentMarks.open(dir, logEnds);
    expect([3, 10, 11].map((s) => after.sentBefore("c1", "t.a", s))).toEqual([true, true, false]);
    expect(after.sentBefore("c9", "t.b", 1)).toBe(false); // a channel empty at start: nothing was sent
    await after.close();
    await m.close();
  });

  test("a damaged file counts as a crash; a forgotten client starts over", async () => {
    const dir = join(tmpDir(), "marks");
    await (await SentMarks.open(dir, new Map())).close();
    writeFileSync(join(dir, "sent-marks.json"), "{not json");
    const m = await SentMarks.open(dir, logEnds);
    expect(m.sentBefore("c1", "t.a", 10)).toBe(true);
    m.sending("c2", "t.a", 12);
    m.forget("c2");
    await m.close();
    const clean = await SentMarks.open(dir, logEnds);
    expect(clean.sentBefore("c2", "t.a", 12)).toBe(false);
    await clean.close();
  });
});
