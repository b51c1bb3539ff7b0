import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { Packr } from "msgpackr";
import { startTestAgent, type TestAgent } from "../helpers.ts";

let a: TestAgent;
beforeAll(async () => {
  a = await startTestAgent({ api: { max_message_bytes: "64KiB" } });
});
afterAll(() => a.stop());

const pack = new Packr({ useRecords: false });
const pullAll = async (channel: string, sub: string) =>
  ((await (await a.call("GET", `/v1/channels/${channel}/messages?subscriber=${sub}&from=earliest&max=1000`)).json()) as { messages: any[] }).messages;

describe("POST /v1/channels/{channel}/messages", () => {
  test("one JSON message: 201 with id, channel, seq, ts after the durable write", async () => {
    const r = await a.call("POST", "/v1/channels/sensors.temp/messages", JSON.stringify({ type: "reading", payload: { c: 21.5 }, correlation_id: "c-1", service_name: "probe" }));
    expect(r.status).toBe(201);
    const body = (await r.json()) as any;
    expect(Object.keys(body).sort()).toEqual(["channel", "id", "seq", "ts"]);
    expect(body).toMatchObject({ channel: "sensors.temp", seq: 1 });
    expect(r.headers.get("content-type")).toMatch(/^application\/json(;|$)/);
    const [m] = await pullAll("sensors.temp", "check1");
    expect(m).toMatchObject({ id: body.id, seq: 1, type: "reading", payload: { c: 21.5 }, correlation_id: "c-1", service_name: "probe", origin: "test-agent", route: ["test-agent"] });
  });

  test("correlation_data as base64 bytes or text is stored as bytes; anything else is 400", async () => {
    const ok = await a.call("POST", "/v1/channels/cd.a/messages", JSON.stringify({ type: "r", payload: 1, correlation_data: { $base64: "AAEC+g==" } }));
    expect(ok.status).toBe(201);
    expect((await a.call("POST", "/v1/channels/cd.a/messages", JSON.stringify({ type: "r", payload: 2, correlation_data: "abc" }))).status).toBe(201);
    const [m1, m2] = await pullAll("cd.a", "cd");
    expect(m1.correlation_data).toEqual({ $base64: "AAEC+g==" });
    expect(m2.correlation_data).toEqual({ $base64: Buffer.from("abc").toString("base64") });
    for (const bad of [42, { $base64: "!!" }, { $base64: "AA==", x: 1 }, null]) {
      const r = await a.call("POST", "/v1/channels/cd.a/messages", JSON.stringify({ type: "r", payload: 1, correlation_data: bad }));
      expect(r.status).toBe(400);
    }
  });

  test("NDJSON batch: one result per line, in order, blank lines skipped", async () => {
    const lines = [1, 2, 3].map((i) => JSON.stringify({ type: "n", payload: i })).join("\n\n") + "\n";
    const r = await a.call("POST", "/v1/channels/batch.a/messages", lines, { "content-type": "application/x-ndjson" });
    expect(r.status).toBe(201);
    const { results } = (await r.json()) as any;
    expect(results.map((x: any) => x.seq)).toEqual([1, 2, 3]);
    expect((await pullAll("batch.a", "c")).map((m) => m.payload)).toEqual([1, 2, 3]);
  });

  test("NDJSON with one bad line stores nothing and names the line", async () => {
    const body = `{"type":"n","payload":1}\n{"type":"n","payload":\n`;
    const r = await a.call("POST", "/v1/channels/batch.b/messages", body, { "content-type": "application/x-ndjson" });
    expect(r.status).toBe(400);
    expect(((await r.json()) as any).error.message).toContain("line 2");
    expect(existsSync(join(a.dir, "data", "channels", "batch.b"))).toBe(false);
  });

  test("msgpack: a single map, an array of maps, and binary payloads kept as bytes", async () => {
    let r = await a.call("POST", "/v1/channels/mp.one/messages", pack.pack({ type: "raw", payload: new Uint8Array([0, 1, 255]) }), { "content-type": "application/msgpack" });
    expect(r.status).toBe(201);
    r = await a.call(
      "POST",
      "/v1/channels/mp.one/messages",
      pack.pack([
        { type: "n", payload: 1 },
        { type: "n", payload: 2 },
      ]),
      { "content-type": "application/msgpack" },
    );
    expect(((await r.json()) as any).results.length).toBe(2);
    const msgs = await pullAll("mp.one", "c");
    expect(msgs[0].payload).toEqual({ $base64: Buffer.from([0, 1, 255]).toString("base64") });
    expect(msgs.slice(1).map((m) => m.payload)).toEqual([1, 2]);
  });

  test("a channel written with percent escapes is the channel they spell", async () => {
    const r = await a.call("POST", "/v1/channels/esc%2Ea%2dB/messages", JSON.stringify({ type: "t", payload: 1 }));
    expect(r.status).toBe(201);
    expect(((await r.json()) as any).channel).toBe("esc.a-B");
    expect((await pullAll("esc.a-B", "c")).map((m) => m.payload)).toEqual([1]);
  });

  const bad: [string, string, string | Uint8Array, Record<string, string>, number, string][] = [
    ["bad JSON", "/v1/channels/x/messages", "{nope", {}, 400, "bad_request"],
    ["not an object", "/v1/channels/x/messages", "[1,2]", {}, 400, "bad_request"],
    ["missing type", "/v1/channels/x/messages", '{"payload":1}', {}, 400, "bad_request"],
    ["unknown field", "/v1/channels/x/messages", '{"type":"t","payloads":1}', {}, 400, "bad_request"],
    ["bad channel", "/v1/channels/a..b/messages", '{"type":"t"}', {}, 400, "invalid_channel"],
    ["traversal", "/v1/channels/..%2F..%2Fetc/messages", '{"type":"t"}', {}, 400, "invalid_channel"],
    ["bad escape", "/v1/channels/a%E0%A4%A/messages", '{"type":"t"}', {}, 400, "bad_request"],
    ["bad escape, not hex", "/v1/channels/a%ZZ/messages", '{"type":"t"}', {}, 400, "bad_request"],
    ["escaped slash", "/v1/channels/a%2Fb/messages", '{"type":"t"}', {}, 400, "invalid_channel"],
    ["escaped NUL", "/v1/channels/a%00/messages", '{"type":"t"}', {}, 400, "invalid_channel"],
    ["trailing slash", "/v1/channels/x/messages/", '{"type":"t"}', {}, 404, "not_found"],
    ["traversal dots", "/v1/channels/../messages", '{"type":"t"}', {}, 404, "not_found"],
    ["pattern on publish", "/v1/channels/a.*/messages", '{"type":"t"}', {}, 400, "invalid_channel"],
    ["dead-letter channel", "/v1/channels/a.dead-letter/messages", '{"type":"t"}', {}, 400, "reserved_channel"],
    ["too large", "/v1/channels/x/messages", JSON.stringify({ type: "t", payload: "x".repeat(70_000) }), {}, 413, "too_large"],
    ["wrong content type", "/v1/channels/x/messages", '{"type":"t"}', { "content-type": "application/x-www-form-urlencoded" }, 415, "unsupported_media_type"],
    ["invalid UTF-8", "/v1/channels/x/messages", new Uint8Array([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x7d]), {}, 400, "bad_request"],
    ["bad msgpack", "/v1/channels/x/messages", new Uint8Array([0xc1]), { "content-type": "application/msgpack" }, 400, "bad_request"],
  ];
  test.each(bad)("%s", async (_what, path, body, headers, status, code) => {
    const r = await a.call("POST", path, body, headers);
    expect(r.status).toBe(status);
    expect(((await r.json()) as any).error.code).toBe(code);
  });

  test("deep nesting is refused or stored, never a crash", async () => {
    const deep = "[".repeat(100_000) + "]".repeat(100_000);
    const r = await a.call("POST", "/v1/channels/deep/messages", `{"type":"t","payload":${deep}}`);
    expect([201, 400, 413]).toContain(r.status);
    expect((await a.call("GET", "/healthz")).status).toBe(200);
  });

  test("nothing outside the data directory was created by any of that", () => {
    expect(readdirSync(a.dir).sort()).toEqual(["data", "k.sock"]);
    for (const ch of readdirSync(join(a.dir, "data", "channels"))) expect(ch).toMatch(/^[A-Za-z0-9_.-]+$/);
  });

  test("unknown routes and methods", async () => {
    expect((await a.call("GET", "/v2/nothing")).status).toBe(404);
    const r = await a.call("PUT", "/v1/channels/x/messages", "{}");
    expect(r.status).toBe(405);
    expect(r.headers.get("allow")).toBe("GET, POST");
  });
});
