/**
 * Messenger configuration as the library takes it (camelCase), with the
 * defaults of docs/config.md filled in one place.
 */
import { hostname } from "node:os";
import { assertName, assertPattern } from "../envelope/names.ts";
import { InvalidArgumentError } from "../errors.ts";
import { silentLogger, type Logger } from "../observability/logger.ts";
import type { SyncMode } from "../store/channel-log.ts";
import type { ChannelPolicy } from "./channel-policy.ts";

/** What `Messenger.open` takes; only `storage.dataDir` is required. */
export interface MessengerConfig {
  /** Instance name stamped as origin and into routes; default: host name. */
  name?: string;
  /** Default service name of publishes made outside any context. */
  serviceName?: string;
  storage: {
    dataDir: string;
    sync?: SyncMode;
    syncIntervalMs?: number;
    segmentBytes?: number;
    retention?: { maxAgeMs?: number; maxBytes?: number };
    /** How often retention runs (ms). */
    retentionCheckMs?: number;
    /** How often acked cursors are written (ms): after a crash a subscriber gets again what it acked in the last this-long (at-least-once), and a longer interval spares an idle board an fdatasync per subscriber. */
    cursorFlushMs?: number;
    /** Bytes of recent records per channel kept in memory for readers. */
    tailCacheBytes?: number;
  };
  subscribers?: { maxRetries?: number; retryBackoffBaseMs?: number; retryBackoffMaxMs?: number };
  /** Largest encoded envelope accepted by publish. */
  maxMessageBytes?: number;
  /** Per channel pattern: default TTL, bound on bytes and full policy (first match applies). */
  channels?: ChannelPolicy[];
  logger?: Logger;
}

/** Every option with its default applied. */
export interface ResolvedConfig {
  name: string;
  serviceName: string | undefined;
  dataDir: string;
  sync: SyncMode;
  syncIntervalMs: number;
  segmentBytes: number;
  retention: { maxAgeMs: number | undefined; maxBytes: number | undefined };
  retentionCheckMs: number;
  cursorFlushMs: number;
  tailCacheBytes: number;
  maxRetries: number;
  retryBackoffBaseMs: number;
  retryBackoffMaxMs: number;
  maxMessageBytes: number;
  channels: ChannelPolicy[];
  logger: Logger;
}

/** Defaults (docs/config.md). */
export const DEFAULTS = {
  sync: "always" as SyncMode,
  syncIntervalMs: 200,
  segmentBytes: 64 * 1024 * 1024,
  retentionCheckMs: 60_000,
  cursorFlushMs: 1000,
  tailCacheBytes: 1024 * 1024,
  maxRetries: 5,
  retryBackoffBaseMs: 100,
  retryBackoffMaxMs: 5_000,
  maxMessageBytes: 1024 * 1024,
};

/** Applies defaults and checks ranges; throws `InvalidArgumentError`. */
export function resolveConfig(c: MessengerConfig): ResolvedConfig {
  if (!c?.storage || typeof c.storage.dataDir !== "string" || c.storage.dataDir === "") {
    throw new InvalidArgumentError("storage.dataDir is required");
  }
  const name = c.name ?? (hostname().split(".")[0] || "keyop");
  assertName(name, "instance name");
  const s = c.storage;
  const r: ResolvedConfig = {
    name,
    serviceName: c.serviceName,
    dataDir: s.dataDir,
    sync: s.sync ?? DEFAULTS.sync,
    syncIntervalMs: s.syncIntervalMs ?? DEFAULTS.syncIntervalMs,
    segmentBytes: s.segmentBytes ?? DEFAULTS.segmentBytes,
    retention: { maxAgeMs: s.retention?.maxAgeMs, maxBytes: s.retention?.maxBytes },
    retentionCheckMs: s.retentionCheckMs ?? DEFAULTS.retentionCheckMs,
    cursorFlushMs: s.cursorFlushMs ?? DEFAULTS.cursorFlushMs,
    tailCacheBytes: s.tailCacheBytes ?? DEFAULTS.tailCacheBytes,
    maxRetries: c.subscribers?.maxRetries ?? DEFAULTS.maxRetries,
    retryBackoffBaseMs: c.subscribers?.retryBackoffBaseMs ?? DEFAULTS.retryBackoffBaseMs,
    retryBackoffMaxMs: c.subscribers?.retryBackoffMaxMs ?? DEFAULTS.retryBackoffMaxMs,
    maxMessageBytes: c.maxMessageBytes ?? DEFAULTS.maxMessageBytes,
    channels: c.channels ?? [],
    logger: c.logger ?? silentLogger,
  };
  if (!["always", "interval", "none"].includes(r.sync)) throw new InvalidArgumentError(`storage.sync must be always, interval or none`);
  const positive: [string, number][] = [
    ["storage.syncIntervalMs", r.syncIntervalMs],
    ["storage.retentionCheckMs", r.retentionCheckMs],
    ["storage.cursorFlushMs", r.cursorFlushMs],
    ["subscribers.retryBackoffBaseMs", r.retryBackoffBaseMs],
    ["subscribers.retryBackoffMaxMs", r.retryBackoffMaxMs],
    ["maxMessageBytes", r.maxMessageBytes],
  ];
  for (const [k, v] of positive) if (!(Number.isFinite(v) && v > 0)) throw new InvalidArgumentError(`${k} must be a positive number`);
  if (!(r.segmentBytes >= 4096)) throw new InvalidArgumentError("storage.segmentBytes must be at least 4096");
  if (!(Number.isInteger(r.maxRetries) && r.maxRetries >= 1)) throw new InvalidArgumentError("subscribers.maxRetries must be an integer >= 1");
  r.channels.forEach((p, i) => {
    assertPattern(p.pattern);
    if (p.ttlMs !== undefined && !(Number.isSafeInteger(p.ttlMs) && p.ttlMs > 0)) throw new InvalidArgumentError(`channels[${i}].ttlMs must be a positive integer`);
    if (p.maxBytes !== undefined && !(Number.isSafeInteger(p.maxBytes) && p.maxBytes >= 4096)) throw new InvalidArgumentError(`channels[${i}].maxBytes must be an integer of at least 4096`);
    if (p.fullPolicy !== undefined && !["reject", "drop_oldest", "latest"].includes(p.fullPolicy)) throw new InvalidArgumentError(`channels[${i}].fullPolicy must be reject, drop_oldest or latest`);
  });
  return r;
}
