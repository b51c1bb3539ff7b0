import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { ApiError, LocalClient, UnreachableError } from "../../src/client/local-client.ts";
import type { Message } from "../../src/index.ts";
import { tmpDir, waitFor } from "../helpers.ts";
import { runAgent, type AgentProc } from "./agent-process.ts";

let dir: string;
let agent: AgentProc;
let client: LocalClient;

beforeAll(async () => {
  dir = tmpDir();
  agent = await runAgent(dir);
  client = new LocalClient({ socket: agent.socket });
});

afterAll(async () => {
  agent.child.proc.kill("SIGTERM");
  await agent.child.proc.exited;
});

describe("LocalClient against a keyop run process", () => {
  test("publish, publishBatch, pull and ack give the library's Message shape", async () => {
    const one = await client.publish("lc.a", "reading", { c: 1 }, { correlationId: "corr", serviceName: "svc" });
    const many = await client.publishBatch("lc.a", [
      { type: "reading", payload: 2 },
      { type: "reading", payload: 3 },
    ]);
    expect(many.map((r) => r.seq)).toEqual([one.seq + 1, one.seq + 2]);
    const got = await client.pull("lc.a", "p", { from: "earliest", max: 10 });
    expect(got.map((m) => m.payload)).toEqual([{ c: 1 }, 2, 3]);
    expect(got[0]).toMatchObject({ id: one.id, seq: one.seq, channel: "lc.a", type: "reading", correlationId: "corr", serviceName: "svc", route: [expect.any(String)] });
    // Unacked: they come again. Acked: the cursor moves.
    expect((await client.pull("lc.a", "p", { max: 10 })).length).toBe(3);
    expect((await client.ack("lc.a", "p", got[1]!.seq)).cursor).toBe(got[1]!.seq + 1);
    expect((await client.pull("lc.a", "p", { max: 10 })).map((m) => m.payload)).toEqual([3]);
    const err = await client.publish("bad..name", "t", 1).catch((e) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect(err.code).toBe("invalid_channel");
  });

  test("subscribe: handler in order, acked as it returns; a throwing handler gets the message again", async () => {
    for (let i = 0; i < 5; i++) await client.publish("lc.sub", "n", i);
    const seen: number[] = [];
    let failedOnce = false;
    const errors: unknown[] = [];
    const sub = client.subscribe(
      "lc.sub",
      "s",
      (m: Message) => {
        if (m.payload === 2 && !failedOnce) {
          failedOnce = true;
          throw new Error("not now");
        }
        seen.push(m.payload as number);
      },
      { from: "earliest", reconnectBaseMs: 20, onError: (e) => errors.push(e) },
    );
    await waitFor(() => seen.length === 5, "all five handled");
    sub.stop();
    await sub.done;
    expect(seen).toEqual([0, 1, 2, 3, 4]);
    expect(errors.map((e) => (e as Error).message)).toEqual(["not now"]);
    const info = ((await client.channels()).channels as any[]).find((c) => c.channel === "lc.sub");
    expect(info.subscribers.find((s: any) => s.name === "s").cursor).toBe(6);
  });

  test("subscribe survives an agent restart: reconnects and resumes at the acked cursor", async () => {
    const got: number[] = [];
    const errors: unknown[] = [];
    const sub = client.subscribe("lc.restart", "r", (m) => void got.push(m.payload as number), { from: "earliest", reconnectBaseMs: 50, reconnectMaxMs: 200, onError: (e) => errors.push(e) });
    for (let i = 0; i < 3; i++) await client.publish("lc.restart", "n", i);
    await waitFor(() => got.length === 3, "three before the restart");
    agent.child.proc.kill("SIGTERM");
    await agent.child.proc.exited;
    await waitFor(() => errors.length > 0, "the drop is reported");
    agent = await runAgent(dir);
    for (let i = 3; i < 6; i++) await client.publish("lc.restart", "n", i);
    await waitFor(() => got.length >= 6, "the rest after the restart", 15_000);
    sub.stop();
    await sub.done;
    // Acked ones were not delivered again; nothing was lost.
    expect(got).toEqual([0, 1, 2, 3, 4, 5]);
    expect(errors.some((e) => e instanceof UnreachableError)).toBe(true);
  }, 30_000);

  test("subscribe stops with the error when the request itself is refused", async () => {
    const sub = client.subscribe("bad..channel", "x", () => {});
    const err = await sub.done.catch((e) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect(err.status).toBe(400);
  });
});
