/** The dashboard's event stream against a page that stops reading: dropped, not buffered without end. */
import { describe, expect, test } from "bun:test";
import { connect } from "node:net";
import { DashboardServer } from "../../src/dashboard/server.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { freePort, waitFor } from "../helpers.ts";

describe("DashboardServer", () => {
  test("a page that stops reading its events is dropped; one that reads stays", async () => {
    const big = "x".repeat(2 * 1024 * 1024);
    const d = DashboardServer.start({
      config: { listen: `127.0.0.1:${freePort()}`, tls: false, users: [], offlineAfterMs: 1 },
      tls: undefined,
      logger: silentLogger,
      snapshot: async () => ({ fleet: [{ name: `n${Date.now()}`, big }], history: [], agent: {} }),
      maxQueuedEvents: 3,
    });
    try {
      // A reader that reads.
      const ctl = new AbortController();
      const res = await fetch(`http://127.0.0.1:${d.port}/api/events`, { signal: ctl.signal });
      let got = 0;
      const reading = (async () => {
        try {
          for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) got += chunk.length;
        } catch {
          // aborted
        }
      })();
      // A page that sends its request and then reads nothing more.
      const stalled = connect(d.port!, "127.0.0.1");
      await new Promise<void>((r) => stalled.once("connect", () => r()));
      stalled.write(`GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n`);
      stalled.pause();
      await waitFor(() => d.openPages === 2, "both pages open", 10_000);
      await waitFor(() => d.openPages === 1, "the stalled page dropped", 60_000, 50);
      expect(got).toBeGreaterThan(4 * 1024 * 1024);
      stalled.destroy();
      ctl.abort();
      await reading;
    } finally {
      d.stop();
    }
  }, 90_000);
});
