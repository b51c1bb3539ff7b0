import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startTestAgent, waitFor, type TestAgent } from "../helpers.ts";

let a: TestAgent;
beforeAll(async () => {
  a = await startTestAgent();
});
afterAll(() => a.stop());

const pub = (ch: string, payload: unknown) => a.call("POST", `/v1/channels/${ch}/messages`, JSON.stringify({ type: "t", payload }));
const ack = (ch: string, name: string, seq: number) => a.call("POST", `/v1/channels/${ch}/subscribers/${name}/ack`, JSON.stringify({ seq }));

/** Opens a stream and collects parsed lines (or SSE events) until closed. */
function openStream(path: string, accept?: string) {
  const ctl = new AbortController();
  const got: any[] = [];
  const raw: string[] = [];
  const done = (async () => {
    const r = await fetch(`http://keyop${path}`, { unix: a.socket, signal: ctl.signal, headers: accept ? { accept } : {} } as RequestInit);
    const dec = new TextDecoder();
    try {
      for await (const chunk of r.body as AsyncIterable<Uint8Array>) {
        const text = dec.decode(chunk, { stream: true });
        raw.push(text);
        if (accept) {
          for (const m of text.matchAll(/^data: (.*)$/gm)) got.push(JSON.parse(m[1]!));
        } else {
          for (const line of text.split("\n")) if (line.trim()) got.push(JSON.parse(line));
        }
      }
    } catch {
      // aborted
    }
    return r;
  })();
  return { got, raw, close: () => ctl.abort(), done };
}

describe("stream", () => {
  test("NDJSON: max_inflight bounds unacked messages; acks open the window", async () => {
    for (let i = 1; i <= 10; i++) await pub("st.win", i);
    const s = openStream("/v1/channels/st.win/stream?subscriber=w&from=earliest&max_inflight=3");
    await waitFor(() => s.got.length === 3, "first window");
    await Bun.sleep(100); // nothing more may come without an ack
    expect(s.got.map((m) => m.seq)).toEqual([1, 2, 3]);
    await ack("st.win", "w", 2);
    await waitFor(() => s.got.length === 5, "two more after acking 2");
    expect(s.got.map((m) => m.seq)).toEqual([1, 2, 3, 4, 5]);
    s.close();
  });

  test("a dropped stream gets exactly its unacked messages again on reconnect", async () => {
    for (let i = 1; i <= 6; i++) await pub("st.re", i);
    const s1 = openStream("/v1/channels/st.re/stream?subscriber=r&from=earliest&max_inflight=100");
    await waitFor(() => s1.got.length === 6, "all six");
    await ack("st.re", "r", 4);
    s1.close();
    await s1.done;
    const s2 = openStream("/v1/channels/st.re/stream?subscriber=r");
    await waitFor(() => s2.got.length === 2, "the unacked two");
    await pub("st.re", 7);
    await waitFor(() => s2.got.length === 3, "and the new one");
    expect(s2.got.map((m) => m.seq)).toEqual([5, 6, 7]);
    s2.close();
  });

  test("live: a message published while streaming arrives without polling delay", async () => {
    const s = openStream("/v1/channels/st.live/stream?subscriber=l");
    await Bun.sleep(50);
    const t0 = performance.now();
    await pub("st.live", "now");
    await waitFor(() => s.got.length === 1, "live message", 5000, 1);
    expect(performance.now() - t0).toBeLessThan(1000);
    expect(s.got[0].payload).toBe("now");
    s.close();
  });

  test("SSE with Accept: text/event-stream", async () => {
    await pub("st.sse", { x: 1 });
    const s = openStream("/v1/channels/st.sse/stream?subscriber=e&from=earliest", "text/event-stream");
    await waitFor(() => s.got.length === 1, "sse event");
    expect(s.raw.join("")).toMatch(/^id: st\.sse:1\nevent: message\ndata: \{/m);
    expect(s.got[0]).toMatchObject({ channel: "st.sse", seq: 1, payload: { x: 1 } });
    s.close();
  });

  test("auto_ack=true moves the cursor as messages are sent", async () => {
    for (let i = 1; i <= 3; i++) await pub("st.auto", i);
    const s = openStream("/v1/channels/st.auto/stream?subscriber=aa&from=earliest&auto_ack=true&max_inflight=1");
    await waitFor(() => s.got.length === 3, "all three despite max_inflight=1");
    const ch = ((await (await a.call("GET", "/v1/channels")).json()) as any).channels.find((c: any) => c.channel === "st.auto");
    await waitFor(async () => {
      const c = ((await (await a.call("GET", "/v1/channels")).json()) as any).channels.find((c: any) => c.channel === "st.auto");
      return c.subscribers.find((x: any) => x.name === "aa").cursor === 4;
    }, "cursor at 4");
    expect(ch).toBeDefined();
    s.close();
  });

  test('WebSocket on the same path: messages as frames, acks as {"ack":seq}, window honoured', async () => {
    for (let i = 1; i <= 4; i++) await pub("st.ws", i);
    const got: any[] = [];
    const errors: any[] = [];
    const ws = new WebSocket(`ws+unix://${a.socket}:/v1/channels/st.ws/stream?subscriber=ws1&from=earliest&max_inflight=2`);
    ws.onmessage = (e) => {
      const m = JSON.parse(String(e.data));
      if (m.error) errors.push(m.error);
      else got.push(m);
    };
    await waitFor(() => got.length === 2, "first two frames");
    await Bun.sleep(100);
    expect(got.length).toBe(2);
    ws.send(JSON.stringify({ ack: 2 }));
    await waitFor(() => got.length === 4, "the rest after the ack");
    ws.send("not json");
    ws.send(JSON.stringify({ ack: 999 }));
    await waitFor(() => errors.length === 2, "two error frames");
    expect(errors.map((e) => e.code)).toEqual(["bad_request", "invalid_argument"]);
    expect(ws.readyState).toBe(WebSocket.OPEN);
    ws.send(JSON.stringify({ ack: 4 }));
    await waitFor(async () => {
      const c = ((await (await a.call("GET", "/v1/channels")).json()) as any).channels.find((c: any) => c.channel === "st.ws");
      return c.subscribers[0].cursor === 5;
    }, "cursor at 5");
    ws.close();
  });

  test("a stream idle past Bun's default idle timeout (10 s) stays open and still delivers", async () => {
    const s = openStream("/v1/channels/st.idle/stream?subscriber=i");
    await waitFor(() => s.raw.length > 0, "the stream's first keep-alive");
    await Bun.sleep(11_000); // the point of the test: longer than the 10 s Bun would cut it at
    await pub("st.idle", "late");
    await waitFor(() => s.got.length === 1, "delivered after 11 s idle");
    s.close();
  }, 30_000);

  test("a second stream for the same subscriber replaces the first", async () => {
    await pub("st.one", 1);
    const s1 = openStream("/v1/channels/st.one/stream?subscriber=o&from=earliest");
    await waitFor(() => s1.got.length === 1, "first stream got it");
    const s2 = openStream("/v1/channels/st.one/stream?subscriber=o");
    await waitFor(() => s2.got.length === 1, "second stream gets the unacked one");
    await s1.done; // the first stream was ended by the server
    s2.close();
  });

  test("stream errors: missing subscriber 400, bad pattern 400, POST 405", async () => {
    expect((await a.call("GET", "/v1/channels/x/stream")).status).toBe(400);
    expect((await a.call("GET", "/v1/channels/a.>.b/stream?subscriber=s")).status).toBe(400);
    expect((await a.call("POST", "/v1/channels/x/stream", "{}")).status).toBe(405);
  });
});
