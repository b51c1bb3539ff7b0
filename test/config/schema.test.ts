import { describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadConfig, parseConfig } from "../../src/config/schema.ts";
import { parseDuration, parseMode, parseSize } from "../../src/config/units.ts";
import { ConfigError } from "../../src/errors.ts";
import { tmpDir } from "../helpers.ts";

function problems(raw: unknown): string[] {
  try {
    parseConfig(raw);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return [...(err as ConfigError).problems];
  }
  throw new Error("expected a ConfigError");
}

describe("units", () => {
  test.each([
    ["500ms", 500],
    ["30s", 30_000],
    ["5m", 300_000],
    ["7d", 604_800_000],
    [250, 250],
    ["1.5s", 1500],
  ])("duration %p", (v, ms) => {
    expect(parseDuration(v)).toBe(ms);
  });
  test.each(["", "5 parsecs", "-1s", "1y", null, {}])("not a duration: %p", (v) => expect(parseDuration(v)).toBeNull());
  test.each([
    ["64MiB", 64 * 2 ** 20],
    ["1GiB", 2 ** 30],
    ["10MB", 10_000_000],
    ["4096", 4096],
    [512, 512],
    ["64kib", 65536],
  ])("size %p", (v, b) => {
    expect(parseSize(v)).toBe(b);
  });
  test.each(["64 lbs", "-1", 1.5, "MiB"])("not a size: %p", (v) => expect(parseSize(v)).toBeNull());
  test.each([
    [660, 0o660],
    ["0660", 0o660],
    ["0o600", 0o600],
    [600, 0o600],
    ["0777", 0o777],
  ])("mode %p", (v, m) => {
    expect(parseMode(v)).toBe(m);
  });
  test.each([680, "rw-rw----", "99999", -1])("not a mode: %p", (v) => expect(parseMode(v)).toBeNull());
});

describe("config", () => {
  test("no config: the embedded defaults", () => {
    const c = parseConfig(undefined);
    expect(c.storage).toEqual({ dataDir: "./keyop-data", sync: "always", syncIntervalMs: 200, segmentBytes: 64 * 2 ** 20, retention: { maxAgeMs: undefined, maxBytes: undefined } });
    expect(c.api).toEqual({ socket: "./keyop-data/keyop.sock", socketMode: 0o660, maxMessageBytes: 2 ** 20, metricsListen: undefined });
    expect(c.subscribers).toEqual({ maxRetries: 5, retryBackoffBaseMs: 100, retryBackoffMaxMs: 5000 });
    expect(c.federation).toEqual({
      reconnectBaseMs: 500,
      reconnectMaxMs: 60_000,
      reconnectJitter: 0.2,
      heartbeatMs: 10_000,
      maxBatchBytes: 2 ** 20,
      window: 8,
      peerExpiryMs: 7 * 86_400_000,
      compression: "auto",
      stallHeartbeats: 3,
    });
    expect(c.dedup.capacity).toBe(100_000);
    expect(c.log).toEqual({ level: "info", format: "json" });
    expect(c.links).toEqual([]);
    expect(c.hub).toBeUndefined();
  });

  test("a full file is read with units, and the socket follows the data dir", () => {
    const c = parseConfig({
      name: "board-7",
      storage: { data_dir: "/var/lib/keyop", sync: "interval", sync_interval_ms: "50ms", segment_bytes: "8MiB", retention: { max_age: "7d", max_bytes: "1GiB" } },
      subscribers: { max_retries: 3, retry_backoff_base_ms: "200ms", retry_backoff_max_ms: "10s" },
      api: { socket_mode: "0600", max_message_bytes: "256KiB" },
      tls: { cert: "a.crt", key: "a.key", ca: "ca.crt" },
      hub: { listen: "0.0.0.0:7740", peers: [{ name: "dev1", publish: ["telemetry.>"], subscribe: ["cmd.dev1.>"] }] },
      links: [{ hub: "hub.example:7740", publish: ["telemetry.>"], subscribe: ["cmd.>"], start: "earliest" }],
      federation: { heartbeat_ms: "5s", window: 4 },
      log: { level: "debug", format: "text" },
    });
    expect(c.name).toBe("board-7");
    expect(c.storage).toMatchObject({ dataDir: "/var/lib/keyop", sync: "interval", syncIntervalMs: 50, segmentBytes: 8 * 2 ** 20, retention: { maxAgeMs: 7 * 86_400_000, maxBytes: 2 ** 30 } });
    expect(c.api).toEqual({ socket: "/var/lib/keyop/keyop.sock", socketMode: 0o600, maxMessageBytes: 256 * 1024, metricsListen: undefined });
    expect(c.hub!.peers[0]).toEqual({ name: "dev1", publish: ["telemetry.>"], subscribe: ["cmd.dev1.>"], subscribeLanes: [{ pattern: "cmd.dev1.>", priority: 4 }], maxBytesPerS: undefined });
    expect(c.links[0]).toEqual({
      hubs: ["hub.example:7740"],
      publish: ["telemetry.>"],
      publishLanes: [{ pattern: "telemetry.>", priority: 4 }],
      subscribe: ["cmd.>"],
      start: "earliest",
      maxBytesPerS: undefined,
    });
    expect(c.federation.heartbeatMs).toBe(5000);
    expect(c.federation.window).toBe(4);
  });

  test("link rules may name a lane, and links and peers a bandwidth cap", () => {
    const c = parseConfig({
      tls: { cert: "a.crt", key: "a.key", ca: "ca.crt" },
      hub: { listen: "0.0.0.0:7740", peers: [{ name: "dev1", subscribe: [{ pattern: "cmd.>", priority: 1 }, "ota.>"], max_bytes_per_s: "64KiB" }] },
      links: [{ hub: "hub:7740", publish: [{ pattern: "alarm.>", priority: 0 }, "telemetry.>"], max_bytes_per_s: 32768 }],
      federation: { compression: "zstd" },
    });
    expect(c.links[0]!.publish).toEqual(["alarm.>", "telemetry.>"]);
    expect(c.links[0]!.publishLanes).toEqual([
      { pattern: "alarm.>", priority: 0 },
      { pattern: "telemetry.>", priority: 4 },
    ]);
    expect(c.links[0]!.maxBytesPerS).toBe(32768);
    expect(c.hub!.peers[0]!.subscribe).toEqual(["cmd.>", "ota.>"]);
    expect(c.hub!.peers[0]!.subscribeLanes[0]).toEqual({ pattern: "cmd.>", priority: 1 });
    expect(c.hub!.peers[0]!.maxBytesPerS).toBe(65536);
    expect(c.federation.compression).toBe("zstd");
    const p = problems({
      tls: { cert: "a.crt", key: "a.key", ca: "ca.crt" },
      links: [{ hub: "hub:7740", publish: [{ pattern: "alarm.>", priority: 9 }, { priority: 1 }, { pattern: "a..b" }, { pattern: "x", prio: 1 }], max_bytes_per_s: 10 }],
      federation: { compression: "lz4" },
    });
    expect(p).toContain("links[0].publish[0].priority: must be an integer from 0 to 7");
    expect(p).toContain("links[0].publish[1].pattern: is required");
    expect(p.some((x) => x.startsWith("links[0].publish[2].pattern:"))).toBe(true);
    expect(p.some((x) => x.startsWith("links[0].publish[3]") && x.includes("prio"))).toBe(true);
    expect(p.some((x) => x.startsWith("links[0].max_bytes_per_s"))).toBe(true);
    expect(p).toContain("federation.compression: must be one of auto, zstd, deflate, none");
  });

  test("every problem is reported at once, each with its key path", () => {
    const p = problems({
      nmae: "x",
      storage: { sync: "sometimes", segment_bytes: "huge", retention: { max_age: "forever" }, colour: 1 },
      subscribers: { max_retries: 0 },
      api: { socket_mode: "rw" },
      hub: { listen: "nowhere", peers: [{ name: "a/b", publish: ["a.>.b"] }, { publish: [] }] },
      links: [{ hub: "h:1", start: "middle" }],
      log: { level: "loud" },
    });
    const expected = [
      "nmae: unknown key",
      "storage.colour: unknown key",
      "storage.sync: must be one of always, interval, none",
      "storage.segment_bytes: must be a size",
      "storage.retention.max_age: must be a duration",
      "subscribers.max_retries: must be an integer from 1",
      "api.socket_mode: must be an octal file mode",
      "hub.listen: must be host:port",
      "hub.peers[0].name:",
      "hub.peers[0].publish[0]:",
      "hub.peers[1].name: is required",
      "links[0].start: must be one of latest, earliest",
      "tls: is required for federation",
      "log.level: must be one of debug, info, warn, error",
    ];
    for (const e of expected) expect(p.some((x) => x.startsWith(e))).toBe(true);
    expect(p.length).toBe(expected.length);
  });

  test("command-line overrides win", () => {
    const c = parseConfig({ storage: { data_dir: "/a" }, log: { level: "warn" } }, { dataDir: "/b", socket: "/run/k.sock", logLevel: "debug" });
    expect(c.storage.dataDir).toBe("/b");
    expect(c.api.socket).toBe("/run/k.sock");
    expect(c.log.level).toBe("debug");
    expect(() => parseConfig(undefined, { logLevel: "chatty" })).toThrow(ConfigError);
  });

  test("files: YAML errors and unreadable files are config errors", async () => {
    const dir = tmpDir();
    const bad = join(dir, "bad.yaml");
    writeFileSync(bad, "storage: [1,\n");
    await expect(loadConfig(bad)).rejects.toBeInstanceOf(ConfigError);
    await expect(loadConfig(join(dir, "missing.yaml"))).rejects.toThrow("cannot read");
    const good = join(dir, "good.yaml");
    writeFileSync(good, "# a comment\nstorage:\n  data_dir: /tmp/x\napi:\n  socket_mode: 0600\n");
    const c = await loadConfig(good);
    expect(c.api.socketMode).toBe(0o600);
    const empty = join(dir, "empty.yaml");
    writeFileSync(empty, "");
    expect((await loadConfig(empty)).storage.dataDir).toBe("./keyop-data");
  });
});
