/**
 * The agent's own log as a receiver's sink: `storeNow` stores a lone
 * record before it returns once the channel's log is open and idle, and
 * otherwise gives the promise `store` would.
 */
import { expect, test } from "bun:test";
import { encodeEnvelope } from "../../src/envelope/envelope.ts";
import { messengerSink } from "../../src/federation/sink.ts";
import { Messenger } from "../../src/index.ts";
import { tmpDir } from "../helpers.ts";

test("messengerSink: storeNow is undefined once the record is stored, a promise when it must wait; store always a promise", async () => {
  const m = await Messenger.open({ name: "hub", storage: { dataDir: tmpDir(), sync: "none" } });
  try {
    const sink = messengerSink(m);
    const rec = (n: number) => ({ id: `id-${n}`, body: encodeEnvelope({ id: `id-${n}`, ts: Date.now(), channel: "up.x", origin: "dev", type: "t", route: ["dev", "hub"], payload: n }) });
    const first = sink.storeNow!("up.x", [rec(1)]);
    expect(first).toBeInstanceOf(Promise); // the channel's log is created first
    await first;
    let n = 1;
    let atOnce = false;
    const deadline = performance.now() + 5_000;
    while (!atOnce && performance.now() < deadline) {
      await new Promise((r) => setImmediate(r));
      const r = sink.storeNow!("up.x", [rec(++n)]);
      if (r === undefined) atOnce = true;
      else await r;
      expect(m.channelLog("up.x")?.nextSeq).toBe(n + 1);
    }
    expect(atOnce).toBe(true);
    // Two records: the promise `store` would give, both stored in order.
    const two = sink.storeNow!("up.x", [rec(++n), rec(++n)]);
    expect(two).toBeInstanceOf(Promise);
    await two;
    expect(m.channelLog("up.x")?.nextSeq).toBe(n + 1);
    const p = sink.store("up.x", [rec(++n)]);
    expect(p).toBeInstanceOf(Promise);
    await p;
    await expect(sink.storeNow!("up.x", [{ id: "x", body: new Uint8Array(2 << 20) }]) ?? Promise.resolve()).rejects.toMatchObject({ code: "too_large" });
    expect(m.channelLog("up.x")?.nextSeq).toBe(n + 1);
  } finally {
    await m.close();
  }
});
