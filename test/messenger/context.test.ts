import { describe, expect, test } from "bun:test";
import { Messenger, currentContext, withContext, type Message } from "../../src/index.ts";
import { tmpDir, waitFor } from "../helpers.ts";

describe("publish context", () => {
  test("withContext stamps service name and correlation id; opts override; nesting merges", async () => {
    const m = await Messenger.open({ name: "dev1", serviceName: "default-svc", storage: { dataDir: tmpDir() } });
    const got: Message[] = [];
    await m.subscribe("c", "s", (msg) => void got.push(msg));
    await m.publish("c", "t", 0);
    await withContext({ serviceName: "sensor" }, async () => {
      await m.publish("c", "t", 1);
      await withContext({ correlationId: "job-1" }, async () => {
        await Bun.sleep(1); // survives an await
        expect(currentContext()).toEqual({ serviceName: "sensor", correlationId: "job-1" });
        await m.publish("c", "t", 2);
        await m.publish("c", "t", 3, { serviceName: "explicit", correlationId: "own" });
      });
    });
    await waitFor(() => got.length === 4, "all");
    expect(got.map((g) => [g.serviceName, g.correlationId])).toEqual([
      ["default-svc", undefined],
      ["sensor", undefined],
      ["sensor", "job-1"],
      ["explicit", "own"],
    ]);
    await m.close();
  });

  test("a handler's publishes inherit the message's correlation id (or its id) and the subscription's service name", async () => {
    const m = await Messenger.open({ name: "dev1", storage: { dataDir: tmpDir() } });
    await withContext({ serviceName: "thermostat" }, () =>
      m.subscribe("temp", "thermostat", async (msg) => {
        await m.publish("heater", "switch", { on: true });
        void msg;
      }),
    );
    const heater: Message[] = [];
    await m.subscribe("heater", "switch", (msg) => void heater.push(msg));
    const reading = await m.publish("temp", "reading", 17, { serviceName: "sensor" });
    await m.publish("temp", "reading", 16, { correlationId: "chain-7" });
    await waitFor(() => heater.length === 2, "downstream");
    expect(heater[0]).toMatchObject({ serviceName: "thermostat", correlationId: reading.id });
    expect(heater[1]).toMatchObject({ serviceName: "thermostat", correlationId: "chain-7" });
    await m.close();
  });
});
