import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { Messenger } from "../../src/index.ts";
import { parseConfig } from "../../src/config/schema.ts";
import { Federation } from "../../src/federation/federation.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import type { TlsMaterial } from "../../src/pki/tls.ts";
import { tmpDir } from "../helpers.ts";

const DAY = 86_400_000;

describe("federation cursor clean-up", () => {
  test("cursors of peers unseen for peer_expiry go (unpinning retention); recent ones and application subscribers stay", async () => {
    const dir = tmpDir();
    const m = await Messenger.open({ name: "hub", storage: { dataDir: join(dir, "d") } });
    await m.publish("t.a", "n", 1);
    m.openSubscriber("t.>", "_fed.gone", { from: "earliest" });
    m.openSubscriber("cmd.>", "_fed.gone", { from: "earliest" });
    m.openSubscriber("t.>", "_fed.recent", { from: "earliest" });
    m.openSubscriber("t.>", "app", { from: "earliest" });
    const cfg = parseConfig({ federation: { peer_expiry: "7d" } });
    const fed = new Federation(m, cfg, undefined as unknown as TlsMaterial, silentLogger);
    // Nobody is older than 7 days yet.
    expect(await fed.cleanupPeerCursors(Date.now() + DAY)).toEqual([]);
    // "recent" connects again five days from now (its forwarder touches its cursor).
    const t0 = Date.now();
    m.openSubscriber("t.>", "_fed.recent", { create: false }).touch(t0 + 5 * DAY);
    // Eight days on: "gone" has not been seen for 8 days, "recent" for 3.
    expect((await fed.cleanupPeerCursors(t0 + 8 * DAY)).sort()).toEqual(["_fed.gone on cmd.>", "_fed.gone on t.>"]);
    expect(
      m
        .subscribers()
        .map((s) => s.name)
        .sort(),
    ).toEqual(["_fed.recent", "app"]);
    // Thirteen days on, "recent" is gone too; the application's subscriber is never touched by this.
    expect(await fed.cleanupPeerCursors(t0 + 13 * DAY)).toEqual(["_fed.recent on t.>"]);
    expect(m.subscribers().map((s) => s.name)).toEqual(["app"]);
    await m.close();
  });

  test("peer_expiry is validated", () => {
    expect(() => parseConfig({ federation: { peer_expiry: "5s" } })).toThrow("federation.peer_expiry: must be a duration of at least 60000 ms");
  });
});
