import { describe, expect, test } from "bun:test";
import { OutQueue } from "../../src/net/out-queue.ts";
import { tmpDir, waitFor } from "../helpers.ts";
import { join } from "node:path";

/** A real Unix socket pair: what the client receives, and the server side's socket. */
async function pair(): Promise<{ server: import("bun").Socket<undefined>; received: () => Uint8Array; close: () => void }> {
  const path = join(tmpDir(), "q.sock");
  const chunks: Uint8Array[] = [];
  let serverSock: import("bun").Socket<undefined> | undefined;
  const listener = Bun.listen({ unix: path, socket: { open: (s) => void (serverSock = s), data() {} } });
  const client = await Bun.connect({ unix: path, socket: { data: (_s, d) => void chunks.push(new Uint8Array(d)) } });
  await waitFor(() => serverSock, "accepted");
  return {
    server: serverSock!,
    received: () => {
      const out = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
      let at = 0;
      for (const c of chunks) {
        out.set(c, at);
        at += c.length;
      }
      return out;
    },
    close: () => {
      client.end();
      listener.stop(true);
    },
  };
}

describe("OutQueue", () => {
  test("everything pushed in one turn goes out in one socket write, in order", async () => {
    const p = await pair();
    const writes: number[] = [];
    const q = new OutQueue((b) => {
      writes.push(b.length);
      return p.server.write(b);
    }, 1 << 20);
    for (let i = 0; i < 100; i++) q.push(Uint8Array.of(0x40, 0x02, i >> 8, i & 0xff));
    expect(writes).toEqual([]); // nothing before the end of the turn
    await waitFor(() => p.received().length === 400, "400 bytes at the client");
    expect(writes).toEqual([400]);
    const got = p.received();
    for (let i = 0; i < 100; i++) expect(got[i * 4 + 3]).toBe(i & 0xff);
    p.close();
  });

  test("what the socket does not take waits for drained(), in order, and no write happens meanwhile", async () => {
    const taken: number[] = [];
    let room = 5;
    const q = new OutQueue((b) => {
      const n = Math.min(room, b.length);
      room -= n;
      for (const x of b.subarray(0, n)) taken.push(x);
      return n;
    }, 8);
    expect(q.push(Uint8Array.of(1, 2, 3))).toBe(true);
    expect(q.push(Uint8Array.of(4, 5, 6, 7))).toBe(true);
    await waitFor(() => taken.length === 5, "the first five bytes");
    expect(q.bytes).toBe(2);
    expect(q.push(Uint8Array.of(8, 9, 10, 11, 12, 13, 14))).toBe(false); // 9 queued > high water 8
    let released = false;
    const w = q.writable().then(() => (released = true));
    await new Promise((r) => setImmediate(r));
    expect(taken).toEqual([1, 2, 3, 4, 5]); // blocked: the scheduled flush wrote nothing
    expect(released).toBe(false);
    room = 100;
    q.drained();
    await w;
    expect(taken).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
    expect(q.bytes).toBe(0);
  });

  test("pushCopy: copies of a reused buffer go out in order with what push and pushNow queue, unchanged by later reuse, through partial writes and a staging buffer that fills", async () => {
    const writes: number[][] = [];
    let room = 1_000_000;
    const q = new OutQueue((b) => {
      const n = Math.min(room, b.length);
      room -= n;
      writes.push([...b.subarray(0, n)]);
      return n;
    }, 1 << 20);
    const scratch = new Uint8Array(4);
    const copy = (v: number) => {
      scratch.fill(v);
      return q.pushCopy(scratch);
    };
    const want: number[] = [];
    const expectSent = () => expect(writes.flat()).toEqual(want);
    // Copies of one turn, between queued arrays, then the write at the end of the turn: one write.
    copy(1);
    q.push(Uint8Array.of(2, 2));
    copy(3);
    copy(4);
    want.push(1, 1, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4);
    expect(q.bytes).toBe(want.length);
    expect(writes).toEqual([]);
    await new Promise((r) => setImmediate(r));
    expect(writes).toHaveLength(1);
    expectSent();
    // pushNow after copies: the copies first, at once.
    copy(5);
    q.pushNow(Uint8Array.of(6));
    want.push(5, 5, 5, 5, 6);
    expectSent();
    // The socket takes part of a run: the rest waits for drained(); copies made meanwhile do not overwrite it.
    room = 3;
    for (let v = 7; v < 12; v++) copy(v);
    for (let v = 7; v < 12; v++) want.push(v, v, v, v);
    await new Promise((r) => setImmediate(r));
    expect(q.bytes).toBe(20 - 3);
    for (let v = 12; v < 14; v++) copy(v);
    for (let v = 12; v < 14; v++) want.push(v, v, v, v);
    room = 1_000_000;
    q.drained();
    expectSent();
    // More copies than the staging buffer holds in one turn (4 KiB), and one larger than a copy is staged for.
    for (let i = 0; i < 3000; i++) {
      copy(i & 0xff);
      want.push(i & 0xff, i & 0xff, i & 0xff, i & 0xff);
    }
    const big = new Uint8Array(300).fill(9);
    q.pushCopy(big);
    big.fill(0);
    want.push(...new Array(300).fill(9));
    await new Promise((r) => setImmediate(r));
    expectSent();
    expect(q.bytes).toBe(0);
    q.close();
    expect(q.pushCopy(scratch)).toBe(false);
  });

  test("pushNow writes at once, after whatever was queued; a part the socket did not take waits for drained(), in order", async () => {
    const writes: number[][] = [];
    let room = 100;
    const q = new OutQueue((b) => {
      const n = Math.min(room, b.length);
      room -= n;
      writes.push([...b.subarray(0, n)]);
      return n;
    }, 8);
    // Nothing queued: written in the call, no write left for the end of the turn.
    expect(q.pushNow(Uint8Array.of(1, 2))).toBe(true);
    expect(writes).toEqual([[1, 2]]);
    await new Promise((r) => setImmediate(r));
    expect(writes).toEqual([[1, 2]]);
    // Queued bytes go first, in the same write.
    q.push(Uint8Array.of(3));
    q.pushNow(Uint8Array.of(4, 5));
    expect(writes).toEqual([
      [1, 2],
      [3, 4, 5],
    ]);
    // The socket takes part: the rest waits, later bytes queue behind it, nothing is written until drained().
    room = 1;
    expect(q.pushNow(Uint8Array.of(6, 7, 8))).toBe(true);
    expect(q.bytes).toBe(2);
    expect(q.pushNow(Uint8Array.of(9, 10, 11, 12, 13, 14, 15))).toBe(false); // 9 queued > high water 8
    await new Promise((r) => setImmediate(r));
    expect(writes).toEqual([[1, 2], [3, 4, 5], [6]]);
    room = 100;
    q.drained();
    expect(writes.flat()).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
    expect(q.bytes).toBe(0);
    q.close();
    expect(q.pushNow(Uint8Array.of(16))).toBe(false);
  });

  test("close() drops what waits and releases writers; later pushes are refused", async () => {
    const q = new OutQueue(() => 0, 1);
    q.push(Uint8Array.of(1, 2, 3));
    await new Promise((r) => setImmediate(r));
    const w = q.writable();
    q.close();
    await w;
    expect(q.bytes).toBe(0);
    expect(q.push(Uint8Array.of(4))).toBe(false);
  });
});
