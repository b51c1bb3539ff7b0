import { describe, expect, test } from "bun:test";
import { Outcome } from "../../src/store/outcome.ts";

const BODY = new Uint8Array([1, 2, 3]);

describe("Outcome", () => {
  test("settled before it is asked: the seq itself; a failure: a rejected promise", async () => {
    const ok = new Outcome(BODY, 0);
    ok.resolve(0);
    expect(ok.now()).toBe(0);
    expect(await ok.later()).toBe(0);
    const bad = new Outcome(BODY, 0);
    bad.reject(new Error("disk"));
    await expect(bad.now() as Promise<number>).rejects.toThrow("disk");
    await expect(bad.later()).rejects.toThrow("disk");
  });

  test("asked before it is settled: a promise that settles with it, either way", async () => {
    const ok = new Outcome(BODY, 0);
    const p = ok.now();
    expect(p).toBeInstanceOf(Promise);
    ok.resolve(7);
    expect(await p).toBe(7);
    const bad = new Outcome(BODY, 0);
    const q = bad.later();
    bad.reject(new Error("fdatasync"));
    await expect(q).rejects.toThrow("fdatasync");
  });

  test("it is the log's pending entry: it carries the body and the time of the request", () => {
    const o = new Outcome(BODY, 12.5);
    expect(o.body).toBe(BODY);
    expect(o.at).toBe(12.5);
  });
});
