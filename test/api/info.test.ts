import { describe, expect, test } from "bun:test";
import { statSync } from "node:fs";
import { startTestAgent, waitFor } from "../helpers.ts";

describe("info endpoints", () => {
  test("healthz, status, channels and metrics", async () => {
    const a = await startTestAgent({ api: { socket_mode: "0600" } });
    try {
      expect(statSync(a.socket).mode & 0o777).toBe(0o600);
      expect(await (await a.call("GET", "/healthz")).text()).toBe("ok\n");
      await a.call("POST", "/v1/channels/m.a/messages", JSON.stringify({ type: "t", payload: 1 }));
      await a.call("POST", "/v1/channels/m.a/messages", JSON.stringify({ type: "t", payload: 2 }));
      await a.call("GET", "/v1/channels/m.a/messages?subscriber=s&from=earliest");
      await a.call("POST", "/v1/channels/m.a/subscribers/s/ack", JSON.stringify({ seq: 1 }));
      const st = (await (await a.call("GET", "/v1/status")).json()) as any;
      expect(st).toMatchObject({ name: "test-agent", sync: "always", links: [], storage: { channels: 1, messages: 2, subscribers: 1 } });
      expect(st.version).toMatch(/^\d+\.\d+\.\d+/);
      expect(st.uptime_s).toBeGreaterThanOrEqual(0);
      const ch = (await (await a.call("GET", "/v1/channels")).json()) as any;
      expect(ch.channels[0]).toMatchObject({ channel: "m.a", first_seq: 1, next_seq: 3, messages: 2, published: 2, delivered: 2, acked: 1 });
      expect(ch.channels[0].subscribers).toEqual([{ name: "s", pattern: "m.a", cursor: 2, lag: 1, skipped: 0, active: false }]);
      const r = await a.call("GET", "/metrics");
      expect(r.headers.get("content-type")).toContain("text/plain");
      const text = await r.text();
      for (const line of [
        'keyop_messages_published_total{channel="m.a"} 2',
        'keyop_messages_delivered_total{channel="m.a"} 2',
        'keyop_messages_acked_total{channel="m.a"} 1',
        'keyop_messages_dead_lettered_total{channel="m.a"} 0',
        'keyop_subscriber_lag{channel="m.a",subscriber="s",pattern="m.a"} 1',
        "# TYPE keyop_fsync_duration_seconds histogram",
        "keyop_publish_duration_seconds_count 2",
        "keyop_api_requests_in_flight 1",
      ]) {
        expect(text).toContain(line);
      }
      // every sample line is "name{labels} number"
      for (const l of text.split("\n").filter((l) => l && !l.startsWith("#"))) expect(l).toMatch(/^[a-z_]+(\{[^}]*\})? -?[0-9.e+-]+$/);
    } finally {
      await a.stop();
    }
  });

  test("shutdown: waiting long-polls return, new requests get 503 or find no socket, the socket file goes", async () => {
    const a = await startTestAgent();
    const waiting = a.call("GET", "/v1/channels/sd/messages?subscriber=s&wait=60000");
    await waitFor(() => a.agent.api.requestsInFlight === 1, "long-poll in flight");
    const t0 = performance.now();
    const stopping = a.stop();
    const r = await waiting;
    expect(r.status).toBe(200);
    expect(((await r.json()) as any).messages).toEqual([]);
    expect(performance.now() - t0).toBeLessThan(5000);
    await stopping;
    expect(() => statSync(a.socket)).toThrow();
  });
});
