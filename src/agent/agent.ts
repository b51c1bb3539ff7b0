/**
 * The agent behind `keyop run`: one Messenger on the data directory and the
 * local API on its Unix socket, started and stopped together.
 */
import { resolve } from "node:path";
import { ApiServer } from "../api/server.ts";
import type { AgentConfig } from "../config/schema.ts";
import { KeyopError } from "../errors.ts";
import { Messenger } from "../messenger/messenger.ts";
import type { Logger } from "../observability/logger.ts";
import { COMMIT, VERSION } from "../version.ts";

/** Largest NDJSON or msgpack batch body: 16 MiB, or one message if larger. */
export function batchLimit(maxMessageBytes: number): number {
  return Math.max(16 * 1024 * 1024, maxMessageBytes);
}

/** A running agent. */
export class Agent {
  readonly config: AgentConfig;
  readonly messenger: Messenger;
  readonly api: ApiServer;
  private readonly logger: Logger;
  private readonly startedAt = Date.now();
  private stopping: Promise<void> | null = null;

  private constructor(config: AgentConfig, messenger: Messenger, api: ApiServer, logger: Logger) {
    this.config = config;
    this.messenger = messenger;
    this.api = api;
    this.logger = logger;
  }

  /** Opens the data directory and starts serving the API socket. */
  static async start(config: AgentConfig, logger: Logger): Promise<Agent> {
    if (config.hub || config.links.length > 0) {
      throw new KeyopError("invalid_config", "hub and links (federation) are not available in this build yet; remove them to run the local agent");
    }
    const messenger = await Messenger.open({
      name: config.name,
      storage: {
        dataDir: config.storage.dataDir,
        sync: config.storage.sync,
        syncIntervalMs: config.storage.syncIntervalMs,
        segmentBytes: config.storage.segmentBytes,
        retention: { maxAgeMs: config.storage.retention.maxAgeMs, maxBytes: config.storage.retention.maxBytes },
      },
      subscribers: config.subscribers,
      maxMessageBytes: config.api.maxMessageBytes,
      logger,
    });
    let agent: Agent | undefined;
    try {
      const api = await ApiServer.start({
        socketPath: config.api.socket,
        socketMode: config.api.socketMode,
        messenger,
        limits: { maxMessageBytes: config.api.maxMessageBytes, maxBatchBytes: batchLimit(config.api.maxMessageBytes) },
        logger,
        status: () => agent!.statusFields(),
        gauges: () => ({ keyop_uptime_seconds: { help: "Seconds since the agent started.", value: (Date.now() - (agent?.startedAt ?? Date.now())) / 1000 } }),
      });
      agent = new Agent(config, messenger, api, logger);
    } catch (err) {
      await messenger.close();
      throw err;
    }
    logger.info("agent started", { name: messenger.name, version: VERSION, data_dir: resolve(config.storage.dataDir), socket: resolve(config.api.socket), pid: process.pid });
    return agent;
  }

  private statusFields(): Record<string, unknown> {
    return {
      name: this.messenger.name,
      version: VERSION,
      commit: COMMIT,
      pid: process.pid,
      started_at: new Date(this.startedAt).toISOString(),
      uptime_s: Math.round((Date.now() - this.startedAt) / 1000),
      data_dir: resolve(this.config.storage.dataDir),
      sync: this.config.storage.sync,
      links: [],
    };
  }

  /**
   * Stops taking requests, lets in-flight publishes finish their durable
   * write, stops subscribers, flushes cursors and releases the directory.
   */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      this.logger.info("agent stopping");
      await this.api.stop();
      await this.messenger.close();
      this.logger.info("agent stopped");
    })();
    return this.stopping;
  }
}
