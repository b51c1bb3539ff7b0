import { describe, expect, test } from "bun:test";
import { decodeEnvelope, encodeNewEnvelope } from "../../src/envelope/envelope.ts";
import { MESSAGE_ID_CHARS, MessageIds } from "../../src/envelope/message-id.ts";

const UUID_V7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

/** A seeded source of "random" bytes, so that two generators given the same seed agree. */
function seeded(seed: number): (into: Uint8Array) => void {
  let x = seed >>> 0 || 1;
  return (into) => {
    for (let i = 0; i < into.length; i++) {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      into[i] = x & 0xff;
    }
  };
}

const msOf = (id: string): number => Number.parseInt(id.slice(0, 8) + id.slice(9, 13), 16);
const counterOf = (id: string): number => Number.parseInt(id.slice(15, 18), 16);

describe("MessageIds", () => {
  test("gives UUIDv7s whose time is the millisecond asked for", () => {
    const ids = new MessageIds();
    for (const ms of [0, 1, 1_700_000_000_123, Date.now(), 2 ** 48 - 1]) {
      const fresh = new MessageIds();
      const id = fresh.next(ms);
      expect(id).toMatch(UUID_V7);
      expect(msOf(id)).toBe(ms);
    }
    const now = Date.now();
    const id = ids.next();
    expect(msOf(id)).toBeGreaterThanOrEqual(now);
    expect(msOf(id)).toBeLessThanOrEqual(Date.now());
  });

  test("ids of one generator rise in the order they were made, within a millisecond and across them", () => {
    const ids = new MessageIds(seeded(7));
    const made: string[] = [];
    let ms = 1_700_000_000_000;
    for (let i = 0; i < 20_000; i++) {
      if (i % 997 === 0) ms += 1 + (i % 3);
      made.push(ids.next(ms));
    }
    const sorted = [...made].sort();
    expect(sorted).toEqual(made);
    expect(new Set(made).size).toBe(made.length);
  });

  test("more than 4,096 ids in one millisecond move the time on by a little and keep rising", () => {
    const ids = new MessageIds(seeded(11));
    const ms = 1_700_000_000_000;
    const made = Array.from({ length: 10_000 }, () => ids.next(ms));
    expect([...made].sort()).toEqual(made);
    expect(new Set(made).size).toBe(made.length);
    // The counter starts below 2,048, so the first millisecond holds at least 2,048 ids; each next one 4,096.
    const last = msOf(made.at(-1)!);
    expect(last).toBeGreaterThan(ms);
    expect(last).toBeLessThanOrEqual(ms + 4);
    expect(made.filter((id) => msOf(id) === ms).length).toBeGreaterThanOrEqual(2048);
    expect(counterOf(made[0]!)).toBeLessThan(2048);
  });

  test("a clock that steps back does not take the ids back", () => {
    const ids = new MessageIds(seeded(3));
    const a = ids.next(1_700_000_005_000);
    const b = ids.next(1_700_000_000_000);
    const c = ids.next(1_700_000_005_000);
    expect(b > a).toBe(true);
    expect(c > b).toBe(true);
    expect(msOf(b)).toBe(1_700_000_005_000);
  });

  test("the last 62 bits are the random source's, behind the variant", () => {
    const zeros = new MessageIds((into) => into.fill(0));
    const id = zeros.next(1_700_000_000_000);
    expect(id.slice(19)).toBe("8000-000000000000");
    expect(counterOf(id)).toBe(0);
    const ones = new MessageIds((into) => into.fill(0xff));
    const other = ones.next(1_700_000_000_000);
    expect(other.slice(19)).toBe("bfff-ffffffffffff");
    expect(counterOf(other)).toBe(0x7ff);
    // Fresh randomness: 100,000 ids of the real source in a few milliseconds, all different.
    const real = new MessageIds();
    const seen = new Set<string>();
    for (let i = 0; i < 100_000; i++) seen.add(real.next());
    expect(seen.size).toBe(100_000);
  });

  test("written into a buffer, an id is the text `next` gives", () => {
    const a = new MessageIds(seeded(42));
    const b = new MessageIds(seeded(42));
    const buf = new Uint8Array(MESSAGE_ID_CHARS + 10).fill(0x55);
    for (let i = 0; i < 5000; i++) {
      const ms = 1_700_000_000_000 + Math.floor(i / 7);
      const text = a.next(ms);
      b.write(buf, 5, ms);
      expect(new TextDecoder().decode(buf.subarray(5, 5 + MESSAGE_ID_CHARS))).toBe(text);
    }
    // Nothing written outside its 36 bytes.
    expect([...buf.subarray(0, 5), ...buf.subarray(5 + MESSAGE_ID_CHARS)].every((x) => x === 0x55)).toBe(true);
  });

  test("an envelope given the generator holds the id it would have been given as text", () => {
    const a = new MessageIds(seeded(9));
    const b = new MessageIds(seeded(9));
    const ts = 1_700_000_000_000;
    for (const payload of ["text", new Uint8Array([1, 2, 3]), { n: 1 }, "x".repeat(70_000)]) {
      const id = a.next(ts);
      const withText = encodeNewEnvelope(id, ts, "up.x", "dev", "t", undefined, undefined, undefined, payload);
      const written = encodeNewEnvelope(b, ts, "up.x", "dev", "t", undefined, undefined, undefined, payload);
      expect(written).toEqual(withText);
      expect(decodeEnvelope(written, 1).id).toBe(id);
    }
  });
});
