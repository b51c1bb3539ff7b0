/**
 * Request/reply through a `keyop run` process: over HTTP, with LocalClient
 * responders on streams, with `keyop sub --exec --reply` as the responder
 * and `keyop request` as the requester.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { ApiError, LocalClient } from "../../src/client/local-client.ts";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import mqtt from "mqtt";
import { BUN, freePort, MAIN, spawnLines, tmpDir, waitFor, type LineChild } from "../helpers.ts";
import { cli, runAgent, type AgentProc } from "./agent-process.ts";

let agent: AgentProc;
let client: LocalClient;
const children: LineChild[] = [];
const mqttPort = freePort();

beforeAll(async () => {
  const dir = tmpDir();
  const cfg = join(dir, "agent.yaml");
  writeFileSync(cfg, `mqtt:\n  listen: 127.0.0.1:${mqttPort}\n`);
  agent = await runAgent(dir, ["--config", cfg]);
  client = new LocalClient({ socket: agent.socket });
});

afterAll(async () => {
  for (const c of children) c.proc.kill("SIGTERM");
  agent.child.proc.kill("SIGTERM");
  await agent.child.proc.exited;
});

/** Sends `fn`'s request until a responder is attached (no_responders before), or the deadline passes. */
async function once<T>(fn: () => Promise<T>): Promise<T> {
  let out: T | undefined;
  await waitFor(
    async () => {
      try {
        out = await fn();
        return true;
      } catch (err) {
        if (err instanceof ApiError && err.code === "no_responders") return false;
        throw err;
      }
    },
    "a responder attached",
    10_000,
    50,
  );
  return out!;
}

describe("request/reply through the agent", () => {
  test("a LocalClient responder on a stream answers; the reply carries the request's id; no inbox is stored", async () => {
    const sub = client.subscribe("svc.add", "adder", async (msg) => {
      const p = msg.payload as { a: number; b: number };
      await client.reply(msg, "sum", { sum: p.a + p.b });
    });
    const reply = await once(() => client.request("svc.add", "ask", { a: 2, b: 40 }, { timeoutMs: 3000 }));
    expect(reply.payload).toEqual({ sum: 42 });
    expect(reply.type).toBe("sum");
    const asked = await client.pull("svc.add", "audit", { from: "earliest", max: 1 });
    expect(reply.correlationId).toBe(asked[0]!.id);
    expect(asked[0]!.replyTo).toBe(reply.channel);
    expect((await client.channels()).channels.some((c) => String(c.channel).startsWith("_inbox"))).toBe(false);
    sub.stop();
    await sub.done;
  });

  test("HTTP: 503 no_responders at once, 504 timeout from a silent consumer, 404 no_request for a late reply", async () => {
    const post = (path: string, body: unknown) =>
      fetch(`http://k${path}`, { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" }, unix: agent.socket } as RequestInit);
    const t0 = performance.now();
    const none = await post("/v1/channels/svc.nobody/requests", { type: "ask", payload: 1 });
    expect(none.status).toBe(503);
    expect(((await none.json()) as any).error.code).toBe("no_responders");
    expect(performance.now() - t0).toBeLessThan(1000);
    let held: { replyTo?: string; id: string } | undefined;
    const silent = client.subscribe("svc.silent", "s", (msg) => void (held = msg));
    let timedOut: Response | undefined;
    await waitFor(
      async () => {
        timedOut = await post("/v1/channels/svc.silent/requests?timeout_ms=200", { type: "ask", payload: 1 });
        return timedOut.status !== 503;
      },
      "the silent consumer attached",
      10_000,
      50,
    );
    expect(timedOut!.status).toBe(504);
    expect(((await timedOut!.json()) as any).error.code).toBe("timeout");
    await waitFor(() => held !== undefined, "the consumer got the request");
    const late = await post(`/v1/channels/${held!.replyTo}/messages`, { type: "r", payload: 1, correlation_id: held!.id });
    expect(late.status).toBe(404);
    expect(((await late.json()) as any).error.code).toBe("no_request");
    silent.stop();
    await silent.done;
  });

  test("keyop sub --exec --reply answers with the command's stdout; keyop request prints the reply, and says no_responders", async () => {
    const responder = spawnLines([
      BUN,
      MAIN,
      "sub",
      "svc.echo",
      "--name",
      "echo",
      "--exec",
      `python3 -c "import json,sys; m=json.load(sys.stdin); print(json.dumps({'echo': m['payload']}))"`,
      "--reply",
      "--socket",
      agent.socket,
    ]);
    children.push(responder);
    let out = "";
    await waitFor(
      async () => {
        const r = await cli(["request", "svc.echo", '{"n": 7}', "--timeout", "5s", "--socket", agent.socket]);
        if (r.code !== 0 && r.err.includes("no_responders")) return false;
        expect(r.code).toBe(0);
        out = r.out;
        return true;
      },
      "keyop sub attached",
      15_000,
      100,
    );
    const reply = JSON.parse(out);
    expect(reply.payload).toEqual({ echo: { n: 7 } });
    expect(reply.type).toBe("reply");
    const none = await cli(["request", "svc.nobody", "{}", "--socket", agent.socket]);
    expect(none.code).toBe(1);
    expect(none.err).toContain("no_responders");
  }, 30_000);

  test("an MQTT 5 client answers on the response topic it was given; the reply reaches the requester", async () => {
    const c = await mqtt.connectAsync(`mqtt://127.0.0.1:${mqttPort}`, { protocolVersion: 5, clean: true });
    c.on("message", (_topic, payload, packet) => {
      const props = packet.properties ?? {};
      if (!props.responseTopic) return;
      const asked = JSON.parse(payload.toString()) as { n: number };
      void c.publishAsync(props.responseTopic, JSON.stringify({ tripled: asked.n * 3 }), { qos: 1, properties: { correlationData: props.correlationData } });
    });
    await c.subscribeAsync("svc/mqtt", { qos: 1 });
    const reply = await once(() => client.request("svc.mqtt", "ask", { n: 5 }, { timeoutMs: 3000 }));
    // MQTT payloads arrive as the bytes the client sent.
    const text = typeof reply.payload === "string" ? reply.payload : new TextDecoder().decode(reply.payload as Uint8Array);
    expect(JSON.parse(text)).toEqual({ tripled: 15 });
    await c.endAsync();
  });

  test("an MQTT 5 requester gets its correlation data back from a keyop sub --reply responder", async () => {
    const responder = spawnLines([BUN, MAIN, "sub", "svc.mq", "--name", "mq-resp", "--exec", "echo '{\"ok\":true}'", "--reply", "--socket", agent.socket]);
    children.push(responder);
    const c = await mqtt.connectAsync(`mqtt://127.0.0.1:${mqttPort}`, { protocolVersion: 5, clean: true });
    const got: { payload: string; cd?: Buffer }[] = [];
    c.on("message", (_t, payload, packet) => got.push({ payload: payload.toString(), cd: packet.properties?.correlationData as Buffer | undefined }));
    await c.subscribeAsync("resp/mq", { qos: 1 });
    const cd = Buffer.from([0, 1, 2, 250]);
    // Sent until the responder is attached (before, nobody takes it: the subscriber starts at latest).
    await waitFor(
      async () => {
        if (got.length > 0) return true;
        await c.publishAsync("svc/mq", JSON.stringify({ n: 1 }), { qos: 1, properties: { responseTopic: "resp/mq", correlationData: cd } });
        await Bun.sleep(200);
        return got.length > 0;
      },
      "a reply on the response topic",
      20_000,
    );
    expect(JSON.parse(got[0]!.payload).ok).toBe(true);
    expect(got[0]!.cd && Buffer.from(got[0]!.cd).equals(cd)).toBe(true);
    await c.endAsync();
  }, 30_000);
});
