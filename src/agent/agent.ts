/**
 * The agent behind `keyop run`: one Messenger on the data directory and the
 * local API on its Unix socket, started and stopped together.
 */
import { federationGauges, jetstreamGauges, jetstreamJson, linkJson } from "./federation-view.ts";
import { type StatsFs, statfsSync } from "node:fs";
import { resolve } from "node:path";
import type { ExtraGauges } from "../observability/metrics.ts";
import { ApiServer, type ReloadReport } from "../api/server.ts";
import type { AgentConfig, DashboardConfig } from "../config/schema.ts";
import { ConfigError, KeyopError } from "../errors.ts";
import { Messenger } from "../messenger/messenger.ts";
import type { Logger } from "../observability/logger.ts";
import { COMMIT, VERSION } from "../version.ts";
import { expiryWarnings, loadTlsMaterial, type TlsMaterial } from "../pki/tls.ts";
import { Federation, type HubTier } from "../federation/federation.ts";
import type { JetStreamEngine } from "../jetstream/engine.ts";
import { MqttServer } from "../mqtt/server.ts";
import { DashboardServer } from "../dashboard/server.ts";
import { History } from "../dashboard/history.ts";
import { SnapshotBuilder } from "../dashboard/snapshot.ts";
import { Histogram } from "../observability/histogram.ts";

/** Largest NDJSON or msgpack batch body: 16 MiB, or one message if larger. */
export function batchLimit(maxMessageBytes: number): number {
  return Math.max(16 * 1024 * 1024, maxMessageBytes);
}

/** A running agent. */
export class Agent {
  config: AgentConfig;
  /** Reads the configuration again (set by `keyop run`: its file and command-line overrides). */
  configSource: (() => Promise<AgentConfig>) | undefined;
  readonly messenger: Messenger;
  readonly api: ApiServer;
  private readonly logger: Logger;
  private readonly startedAt = Date.now();
  private stopping: Promise<void> | null = null;

  /** @internal The certificates in use (reloaded on SIGHUP). */
  tls: TlsMaterial | undefined;
  /** Hub listener and links, when configured. */
  federation: Federation | undefined;
  /** A hub tier's JetStream cluster, when `hub.jetstream` is set. */
  jetstream: JetStreamEngine | undefined;
  /** The MQTT listener, when configured. */
  mqtt: MqttServer | undefined;
  /** The web dashboard and the chart history it shows, when configured. */
  dashboard: DashboardServer | undefined;
  history: History | undefined;

  private constructor(config: AgentConfig, messenger: Messenger, api: ApiServer, logger: Logger, tls: TlsMaterial | undefined) {
    this.tls = tls;
    this.config = config;
    this.messenger = messenger;
    this.api = api;
    this.logger = logger;
  }

  /** Opens the data directory and starts serving the API socket. */
  static async start(config: AgentConfig, logger: Logger): Promise<Agent> {
    const federated = config.hub !== undefined || config.links.length > 0;
    if (federated && process.env.NODE_TLS_REJECT_UNAUTHORIZED === "0") {
      throw new KeyopError("invalid_config", "NODE_TLS_REJECT_UNAUTHORIZED=0 is set: refusing to run federation with certificate checks weakened; unset it");
    }
    const tls = config.tls ? await loadTlsMaterial(config.tls) : undefined;
    if (tls) for (const w of expiryWarnings(tls)) logger.warn("certificate expiry", { warning: w });
    const messenger = await Messenger.open({
      // With TLS the instance is who its certificate says it is.
      name: config.name ?? tls?.name,
      storage: {
        dataDir: config.storage.dataDir,
        sync: config.storage.sync,
        syncIntervalMs: config.storage.syncIntervalMs,
        segmentBytes: config.storage.segmentBytes,
        retention: { maxAgeMs: config.storage.retention.maxAgeMs, maxBytes: config.storage.retention.maxBytes },
      },
      subscribers: config.subscribers,
      maxMessageBytes: config.api.maxMessageBytes,
      channels: config.channels,
      logger,
    });
    let agent: Agent | undefined;
    let mqttServer: MqttServer | undefined;
    let federation: Federation | undefined;
    let jetstream: JetStreamEngine | undefined;
    try {
      // The slow parts first: once the API socket answers, everything the agent offers does.
      if (federated) {
        // The config validation guarantees tls is set whenever hub or links are.
        let tier: HubTier | undefined;
        if (config.hub?.jetstream) {
          // Loaded only here: a board never pays for the NATS client. Connects and provisions in
          // the background: until the cluster answers, peers are refused.
          const [{ JetStreamEngine }, { jetstreamTier }] = await Promise.all([import("../jetstream/engine.ts"), import("../jetstream/tier.ts")]);
          jetstream = new JetStreamEngine(config.hub.jetstream, logger);
          jetstream.start();
          tier = jetstreamTier(jetstream, {
            name: messenger.name,
            window: config.federation.window,
            maxBatchBytes: config.federation.maxBatchBytes,
            maxMessageBytes: config.api.maxMessageBytes,
            logger,
          });
        }
        federation = new Federation(messenger, { hub: config.hub, links: config.links, federation: config.federation, dedup: config.dedup, audit: config.audit }, tls!, logger, tier);
        const t0 = performance.now();
        const seeded = await federation.seedDedup();
        if (seeded > 0) logger.info("duplicate filter loaded from the log", { ids: seeded, ms: Math.round(performance.now() - t0) });
      }
      if (config.mqtt) {
        mqttServer = await MqttServer.start(messenger, config.mqtt, logger, config.storage.dataDir, tls);
        mqttServer.forwards = federation !== undefined;
      }
      const api = await ApiServer.start({
        socketPath: config.api.socket,
        socketMode: config.api.socketMode,
        metricsListen: config.api.metricsListen,
        reload: () => agent!.reload(),
        messenger,
        limits: { maxMessageBytes: config.api.maxMessageBytes, maxBatchBytes: batchLimit(config.api.maxMessageBytes) },
        logger,
        status: () => agent!.statusFields(),
        beforeReport: async () => agent?.federation?.sampleHealth(),
        gauges: () => ({
          keyop_uptime_seconds: { help: "Seconds since the agent started.", value: (Date.now() - (agent?.startedAt ?? Date.now())) / 1000 },
          ...diskGauges(config.storage.dataDir),
          ...(agent?.tls ? tlsGauges(agent.tls) : {}),
          ...(agent?.federation ? federationGauges(agent.federation.links(), agent.federation.auditHealth()) : {}),
          ...(agent?.jetstream ? jetstreamGauges(agent.jetstream.state, agent.jetstream.stats) : {}),
          ...(agent?.mqtt
            ? { keyop_mqtt_session_save_failures: { help: "Saves of the MQTT session state that failed since start (each retried).", value: agent.mqtt.sessions.health().failedSaves } }
            : {}),
        }),
      });
      agent = new Agent(config, messenger, api, logger, tls);
      agent.mqtt = mqttServer;
      agent.jetstream = jetstream;
      if (federation) {
        agent.federation = federation;
        federation.start();
      }
      if (config.dashboard) agent.startDashboard(config.dashboard);
    } catch (err) {
      // The start failed and `err` is what the caller must see; a failed stop of a half-started part is logged.
      const stopFailed = (part: string) => (e: unknown) => logger.warn("stop after a failed start failed", { part, error: String(e) });
      agent?.dashboard?.stop();
      agent?.history?.stop();
      await mqttServer?.stop().catch(stopFailed("mqtt"));
      await federation?.stop().catch(stopFailed("federation"));
      await jetstream?.close().catch(stopFailed("jetstream"));
      await agent?.api.stop().catch(stopFailed("api"));
      await messenger.close();
      throw err;
    }
    logger.info("agent started", { name: messenger.name, version: VERSION, data_dir: resolve(config.storage.dataDir), socket: resolve(config.api.socket), pid: process.pid });
    return agent;
  }

  private startDashboard(cfg: DashboardConfig): void {
    const m = this.messenger;
    this.history = new History({ published: () => m.publishedTotal(), histograms: () => m.histograms() }, Histogram.bound);
    this.history.start();
    const snapshots = new SnapshotBuilder({
      messenger: m,
      federation: this.federation,
      history: this.history,
      agent: () => ({
        name: m.name,
        version: VERSION,
        uptimeS: Math.round((Date.now() - this.startedAt) / 1000),
        role: this.config.hub ? "hub" : this.config.links.length > 0 ? "board" : "agent",
        sync: this.config.storage.sync,
        offlineAfterMs: cfg.offlineAfterMs,
      }),
    });
    this.dashboard = DashboardServer.start({ config: cfg, tls: this.tls, logger: this.logger, snapshot: () => snapshots.build() });
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
      tls: this.tls ? tlsStatus(this.tls) : null,
      links: this.federation?.links().map(linkJson) ?? [],
      ...(this.jetstream ? { jetstream: jetstreamJson(this.jetstream) } : {}),
      ...(this.mqtt ? { mqtt: this.mqtt.status() } : {}),
    };
  }

  /**
   * SIGHUP and `keyop reload`: reads the whole configuration again and
   * applies what can change while running (hub peers, links, MQTT users,
   * retention and channel policies, the log level, the certificates).
   * Unaffected sessions keep running. A file with any problem changes
   * nothing: every problem is logged and returned. A changed key that only
   * a restart applies is named in `restart_needed` and left as it runs.
   */
  async reload(): Promise<ReloadReport> {
    let next: AgentConfig;
    try {
      next = this.configSource ? await this.configSource() : this.config;
    } catch (err) {
      const problems = err instanceof ConfigError ? [...err.problems] : [err instanceof Error ? err.message : String(err)];
      for (const p of problems) this.logger.error("reload: configuration refused, nothing changed", { problem: p });
      return { ok: false, applied: [], restart_needed: [], problems };
    }
    const old = this.config;
    const applied: string[] = [];
    const restart = restartNeeded(old, next);
    if (next.log.level !== old.log.level) {
      this.logger.setLevel?.(next.log.level);
      applied.push(`log level ${next.log.level}`);
    }
    if (JSON.stringify(next.storage.retention) !== JSON.stringify(old.storage.retention) || JSON.stringify(next.channels) !== JSON.stringify(old.channels)) {
      this.messenger.reconfigure({ retention: next.storage.retention, channels: next.channels });
      applied.push("retention and channel policies");
    }
    let peers = old.hub?.peers;
    let links = old.links;
    if (this.federation && (old.hub === undefined) === (next.hub === undefined)) {
      applied.push(...this.federation.reconfigure({ hub: next.hub, links: next.links }));
      peers = next.hub?.peers;
      links = next.links;
    }
    let users = old.mqtt?.users;
    if (this.mqtt && next.mqtt && JSON.stringify(next.mqtt.users) !== JSON.stringify(old.mqtt?.users)) {
      const ended = this.mqtt.setUsers(next.mqtt.users);
      users = next.mqtt.users;
      applied.push(`mqtt users (${ended} client${ended === 1 ? "" : "s"} disconnected)`);
    }
    if (old.tls && (await this.reloadTls())) applied.push("tls certificates");
    // What runs now: the old configuration with what was applied.
    this.config = {
      ...old,
      log: { ...old.log, level: next.log.level },
      storage: { ...old.storage, retention: next.storage.retention },
      channels: next.channels,
      hub: old.hub && peers ? { ...old.hub, peers } : old.hub,
      links,
      mqtt: old.mqtt && users ? { ...old.mqtt, users } : old.mqtt,
    };
    for (const r of restart) this.logger.warn("reload: changed, applied only by a restart", { key: r });
    this.logger.info("configuration reloaded", { applied, restart_needed: restart });
    this.federation?.auditRecord("reconfigured", { applied: applied.join("; "), restart_needed: restart.join(", ") });
    return { ok: true, applied, restart_needed: restart, problems: [] };
  }

  /**
   * Re-reads tls.{cert,key,ca} (SIGHUP). New connections use the new
   * material; if a file is broken the old material stays and the error is
   * logged. Resolves true when the new material is in force.
   */
  async reloadTls(): Promise<boolean> {
    if (!this.config.tls) {
      this.logger.info("reload: nothing to reload (no tls configured)");
      return false;
    }
    try {
      const next = await loadTlsMaterial(this.config.tls);
      if (this.tls && next.name !== this.tls.name) {
        throw new KeyopError("invalid_config", `the new certificate is for "${next.name}", this instance is "${this.tls.name}"`);
      }
      this.tls = next;
      this.federation?.reloadTls(next);
      this.mqtt?.reloadTls(next);
      for (const w of expiryWarnings(next)) this.logger.warn("certificate expiry", { warning: w });
      this.logger.info("tls material reloaded", tlsStatus(next));
      return true;
    } catch (err) {
      this.logger.error("tls reload failed, keeping the current certificate", { error: err instanceof Error ? err.message : String(err) });
      return false;
    }
  }

  /**
   * Stops taking requests, lets in-flight publishes finish their durable
   * write, stops subscribers, flushes cursors and releases the directory.
   */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      this.logger.info("agent stopping");
      this.dashboard?.stop();
      this.history?.stop();
      await this.mqtt?.stop();
      await this.federation?.stop();
      await this.jetstream?.close();
      await this.api.stop();
      await this.messenger.close();
      this.logger.info("agent stopped");
    })();
    return this.stopping;
  }
}

/** The filesystem of the data directory, for alerts before it fills (statfs; nothing when it fails). */
function diskGauges(dataDir: string): ExtraGauges {
  let st: StatsFs;
  try {
    st = statfsSync(dataDir);
  } catch {
    return {};
  }
  return {
    keyop_disk_free_bytes: { help: "Bytes free to the agent on the filesystem of the data directory.", value: st.bavail * st.bsize },
    keyop_disk_size_bytes: { help: "Size in bytes of the filesystem of the data directory.", value: st.blocks * st.bsize },
  };
}

/** When the certificates expire, as Unix time, for alerts days before. */
function tlsGauges(m: TlsMaterial): ExtraGauges {
  const help = "When the certificate expires (Unix time, seconds): cert=own is this instance's, cert=ca the CA's.";
  return {
    keyop_tls_cert_expiry_timestamp_seconds: [
      { help, labels: { cert: "own" }, value: Math.floor(m.own.notAfter.getTime() / 1000) },
      { help, labels: { cert: "ca" }, value: Math.floor(m.ca.notAfter.getTime() / 1000) },
    ],
  };
}

/** Keys that differ between `a` and `b` and that only a restart applies. */
function restartNeeded(a: AgentConfig, b: AgentConfig): string[] {
  const out: string[] = [];
  const differs = (key: string, x: unknown, y: unknown) => {
    if (JSON.stringify(x) !== JSON.stringify(y)) out.push(key);
  };
  differs("name", a.name, b.name);
  const { retention: _ra, ...storageA } = a.storage;
  const { retention: _rb, ...storageB } = b.storage;
  for (const k of Object.keys(storageA) as (keyof typeof storageA)[]) differs(`storage.${k}`, storageA[k], storageB[k]);
  differs("subscribers", a.subscribers, b.subscribers);
  differs("api", a.api, b.api);
  differs("tls", a.tls, b.tls);
  if ((a.hub === undefined) !== (b.hub === undefined)) out.push("hub");
  else if (a.hub && b.hub) {
    differs("hub.listen", a.hub.listen, b.hub.listen);
    differs("hub.jetstream", a.hub.jetstream, b.hub.jetstream);
  }
  if (a.hub === undefined && b.hub === undefined && a.links.length === 0 && b.links.length > 0) out.push("links (the agent started without federation)");
  differs("federation", a.federation, b.federation);
  differs("dedup", a.dedup, b.dedup);
  differs("audit", a.audit, b.audit);
  differs("log.format", a.log.format, b.log.format);
  if ((a.mqtt === undefined) !== (b.mqtt === undefined)) out.push("mqtt");
  else if (a.mqtt && b.mqtt) {
    const { users: _ua, ...ma } = a.mqtt;
    const { users: _ub, ...mb } = b.mqtt;
    differs("mqtt (other than users)", ma, mb);
  }
  return out;
}

/** Certificate facts for /v1/status and logs. */
function tlsStatus(m: TlsMaterial): Record<string, unknown> {
  const days = (d: Date) => Math.floor((d.getTime() - Date.now()) / 86_400_000);
  return {
    name: m.name,
    cert_not_after: m.own.notAfter.toISOString(),
    cert_days_left: days(m.own.notAfter),
    ca: m.ca.subject,
    ca_not_after: m.ca.notAfter.toISOString(),
    ca_days_left: days(m.ca.notAfter),
  };
}
