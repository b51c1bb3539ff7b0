import { describe, expect, test } from "bun:test";
import { Outcome } from "../../src/store/outcome.ts";

describe("Outcome", () => {
  test("settled before it is asked: the seq itself; a failure: a rejected promise", async () => {
    const ok = new Outcome();
    ok.resolve(0);
    expect(ok.now()).toBe(0);
    expect(await ok.later()).toBe(0);
    const bad = new Outcome();
    bad.reject(new Error("disk"));
    await expect(bad.now() as Promise<number>).rejects.toThrow("disk");
    await expect(bad.later()).rejects.toThrow("disk");
  });

  test("asked before it is settled: a promise that settles with it, either way", async () => {
    const ok = new Outcome();
    const p = ok.now();
    expect(p).toBeInstanceOf(Promise);
    ok.resolve(7);
    expect(await p).toBe(7);
    const bad = new Outcome();
    const q = bad.later();
    bad.reject(new Error("fdatasync"));
    await expect(q).rejects.toThrow("fdatasync");
  });
});
