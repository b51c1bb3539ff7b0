/** Streams as members of a queue group (`queue=true`): shared messages, per-message acks, hand-back. */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startTestAgent, waitFor, type TestAgent } from "../helpers.ts";

let a: TestAgent;
beforeAll(async () => {
  a = await startTestAgent();
});
afterAll(() => a.stop());

const pub = (ch: string, payload: unknown) => a.call("POST", `/v1/channels/${ch}/messages`, JSON.stringify({ type: "t", payload }));
const ack = (ch: string, name: string, seq: number) => a.call("POST", `/v1/channels/${ch}/subscribers/${name}/ack`, JSON.stringify({ seq }));
const cursorOf = async (ch: string, name: string) => {
  const c = ((await (await a.call("GET", "/v1/channels")).json()) as any).channels.find((c: any) => c.channel === ch);
  return c?.subscribers.find((s: any) => s.name === name)?.cursor;
};

/** An NDJSON stream collecting envelopes until closed. */
function openStream(path: string) {
  const ctl = new AbortController();
  const got: any[] = [];
  const res = fetch(`http://keyop${path}`, { unix: a.socket, signal: ctl.signal } as RequestInit);
  const done = (async () => {
    const r = await res;
    const dec = new TextDecoder();
    let rest = "";
    try {
      for await (const chunk of r.body as AsyncIterable<Uint8Array>) {
        rest += dec.decode(chunk, { stream: true });
        const lines = rest.split("\n");
        rest = lines.pop()!;
        for (const line of lines) if (line.trim()) got.push(JSON.parse(line));
      }
    } catch {
      // aborted
    }
    return r;
  })();
  // Resolves once the agent answered (the stream is open).
  const ready = res.then((r) => r.status);
  return { got, close: () => ctl.abort(), done, ready };
}

describe("queue group streams", () => {
  test("two streams on one subscriber share its messages, each acked by itself", async () => {
    const s1 = openStream("/v1/channels/qs.a/stream?subscriber=w&from=earliest&queue=true&max_inflight=2");
    const s2 = openStream("/v1/channels/qs.a/stream?subscriber=w&queue=true&max_inflight=2");
    expect([await s1.ready, await s2.ready]).toEqual([200, 200]);
    for (let i = 1; i <= 20; i++) await pub("qs.a", i);
    const acked = new Set<number>();
    // Each acks what it got, one by one, out of order within its window.
    await waitFor(async () => {
      for (const s of [s1, s2])
        for (const m of [...s.got].reverse())
          if (!acked.has(m.seq)) {
            acked.add(m.seq);
            const r = await ack("qs.a", "w", m.seq);
            expect(r.status).toBe(200);
          }
      return acked.size === 20;
    }, "all twenty acked");
    const seqs1 = s1.got.map((m) => m.seq);
    const seqs2 = s2.got.map((m) => m.seq);
    expect(seqs1.length).toBeGreaterThan(0);
    expect(seqs2.length).toBeGreaterThan(0);
    expect(seqs1.filter((x) => seqs2.includes(x))).toEqual([]);
    expect(new Set([...seqs1, ...seqs2]).size).toBe(20);
    await waitFor(async () => (await cursorOf("qs.a", "w")) === 21, "cursor past all");
    s1.close();
    s2.close();
  });

  test("what a closed stream had not acked goes to the other member", async () => {
    for (let i = 1; i <= 6; i++) await pub("qs.b", i);
    const s1 = openStream("/v1/channels/qs.b/stream?subscriber=w&from=earliest&queue=true&max_inflight=6");
    await waitFor(() => s1.got.length === 6, "s1 has all six");
    const s2 = openStream("/v1/channels/qs.b/stream?subscriber=w&queue=true&max_inflight=10");
    await ack("qs.b", "w", 2);
    await ack("qs.b", "w", 5);
    await Bun.sleep(50);
    expect(s2.got).toEqual([]); // s1 still holds them
    s1.close();
    await s1.done;
    await waitFor(() => s2.got.length === 4, "the four s1 had not acked");
    expect(s2.got.map((m) => m.seq)).toEqual([1, 3, 4, 6]);
    for (const m of s2.got) await ack("qs.b", "w", m.seq);
    expect(await cursorOf("qs.b", "w")).toBe(7);
    s2.close();
  });

  test("an exclusive stream on a queue group is refused, and a queue member beside an exclusive stream", async () => {
    const q = openStream("/v1/channels/qs.c/stream?subscriber=w&queue=true");
    expect(await q.ready).toBe(200);
    const r = await a.call("GET", "/v1/channels/qs.c/stream?subscriber=w");
    expect(r.status).toBe(409);
    expect(((await r.json()) as any).error.code).toBe("conflict");
    q.close();
    await q.done;
    await waitFor(async () => ((await a.call("GET", "/v1/status").then((r) => r.json())) as any).api.streams === 0, "closed");
    const x = openStream("/v1/channels/qs.c/stream?subscriber=w");
    expect(await x.ready).toBe(200);
    const r2 = await a.call("GET", "/v1/channels/qs.c/stream?subscriber=w&queue=true");
    expect(r2.status).toBe(409);
    x.close();
    await x.done;
    expect((await a.call("GET", "/v1/channels/qs.c/stream?subscriber=w&key=device")).status).toBe(400);
  });

  test("WebSocket members ack per message; one held past ack_wait_ms goes to the other member", async () => {
    await pub("qs.d", "x");
    const open = (wait: number) => {
      const got: any[] = [];
      const ws = new WebSocket(`ws+unix://${a.socket}:/v1/channels/qs.d/stream?subscriber=w&from=earliest&queue=true&max_inflight=1&ack_wait_ms=${wait}`);
      ws.onmessage = (e) => got.push(JSON.parse(String(e.data)));
      return { ws, got, opened: new Promise((r) => (ws.onopen = r)) };
    };
    const slow = open(150);
    await slow.opened;
    await waitFor(() => slow.got.length === 1, "slow has it");
    const fast = open(60_000);
    await fast.opened;
    await waitFor(() => fast.got.length === 1, "handed on after slow's ack wait", 5000);
    expect(fast.got[0].seq).toBe(slow.got[0].seq);
    fast.ws.send(JSON.stringify({ ack: fast.got[0].seq }));
    await waitFor(async () => (await cursorOf("qs.d", "w")) === 2, "acked");
    slow.ws.send(JSON.stringify({ ack: 99 }));
    slow.ws.close();
    fast.ws.close();
  });

  test("key=device: the messages of one device go to one stream, in order", async () => {
    const s1 = openStream("/v1/channels/qs.k/stream?subscriber=w&from=earliest&queue=true&key=device&max_inflight=50");
    const s2 = openStream("/v1/channels/qs.k/stream?subscriber=w&queue=true&key=device&max_inflight=50");
    expect([await s1.ready, await s2.ready]).toEqual([200, 200]);
    // A member without the group's key is refused.
    expect((await a.call("GET", "/v1/channels/qs.k/stream?subscriber=w&queue=true")).status).toBe(409);
    for (let i = 0; i < 30; i++) await pub("qs.k", { device: `d${i % 4}`, i });
    await waitFor(() => s1.got.length + s2.got.length === 30, "all thirty");
    const devicesOf = (s: { got: any[] }) => new Set(s.got.map((m) => m.payload.device));
    expect([...devicesOf(s1)].filter((d) => devicesOf(s2).has(d))).toEqual([]);
    for (const s of [s1, s2]) {
      const byDevice = new Map<string, number[]>();
      for (const m of s.got) byDevice.set(m.payload.device, [...(byDevice.get(m.payload.device) ?? []), m.payload.i]);
      for (const is of byDevice.values()) expect(is).toEqual([...is].sort((x, y) => x - y));
    }
    s1.close();
    s2.close();
  });
});
