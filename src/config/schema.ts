/**
 * The agent's YAML configuration (docs/config.md): every key, its type, its
 * default, and validation that reports all problems at once, each with its
 * key path, so an operator fixes the file in one go.
 */
import { DEFAULT_DATA_DIR, SOCKET_NAME } from "./defaults.ts";
import { ConfigError } from "../errors.ts";
import { isLogLevel, type LogFormat, type LogLevel } from "../observability/logger.ts";
import type { SyncMode } from "../store/channel-log.ts";
import { type JetStreamConfig, readJetStream } from "./jetstream.ts";
import { Reader } from "./reader.ts";
import type { PriorityRule } from "../federation/priority.ts";
import type { ChannelPolicy } from "../messenger/channel-policy.ts";

/** A peer a hub accepts, with what it may publish into and receive from the hub. */
export interface PeerConfig {
  name: string;
  publish: string[];
  subscribe: string[];
  /** The subscribe rules with their lanes (same order as `subscribe`). */
  subscribeLanes: PriorityRule[];
  /** Cap on the data bytes sent to this peer per second (undefined: none). */
  maxBytesPerS: number | undefined;
}

/** A link from this instance to a hub. */
export interface LinkConfig {
  /** host:port of the hub, or of each hub of a tier that shares one identity: tried in turn. */
  hubs: string[];
  publish: string[];
  /** The publish rules with their lanes (same order as `publish`). */
  publishLanes: PriorityRule[];
  subscribe: string[];
  start: "latest" | "earliest";
  /** Cap on the data bytes sent to the hub per second (undefined: none). */
  maxBytesPerS: number | undefined;
}

/** What a side offers to compress federation batches with. */
export type CompressionSetting = "auto" | "zstd" | "deflate" | "none";

/** The validated configuration with every default applied (camelCase). */
export interface AgentConfig {
  /** Instance name; undefined means: the TLS certificate CN, else the host name. */
  name: string | undefined;
  storage: {
    dataDir: string;
    sync: SyncMode;
    syncIntervalMs: number;
    segmentBytes: number;
    retention: { maxAgeMs: number | undefined; maxBytes: number | undefined };
  };
  subscribers: { maxRetries: number; retryBackoffBaseMs: number; retryBackoffMaxMs: number };
  /** `metricsListen`: host:port where /metrics (and /healthz) are also served over plain HTTP, for a Prometheus server. */
  api: { socket: string; socketMode: number; maxMessageBytes: number; metricsListen: string | undefined };
  tls: { cert: string; key: string; ca: string } | undefined;
  hub: { listen: string; peers: PeerConfig[]; jetstream: JetStreamConfig | undefined } | undefined;
  links: LinkConfig[];
  federation: {
    reconnectBaseMs: number;
    reconnectMaxMs: number;
    reconnectJitter: number;
    heartbeatMs: number;
    maxBatchBytes: number;
    window: number;
    /** Federation cursors of a peer not connected for this long are removed (ms). */
    peerExpiryMs: number;
    compression: CompressionSetting;
    /** Heartbeat periods without an acknowledgement, batches in flight, before a session counts as stalled (0: never). */
    stallHeartbeats: number;
  };
  dedup: { capacity: number };
  audit: { path: string | undefined; maxFileBytes: number; maxFiles: number };
  log: { level: LogLevel; format: LogFormat };
  /** The MQTT listener (off unless the section is present). */
  mqtt: MqttConfig | undefined;
  /** Per channel pattern: default TTL, bound on bytes, full policy (the first entry that matches applies). */
  channels: ChannelPolicy[];
  /** The web dashboard (off unless the section is present; docs/dashboard.md). */
  dashboard: DashboardConfig | undefined;
}

/** Dashboard settings. */
export interface DashboardConfig {
  listen: string;
  /** HTTPS with this instance's certificate; browsers must present a certificate from the keyop CA. */
  tls: boolean;
  /** HTTP basic logins (argon2id hashes from keyop passwd). */
  users: { name: string; passwordHash: string }[];
  /** A board offline longer than this is highlighted (ms). */
  offlineAfterMs: number;
}

/** MQTT listener settings (docs/mqtt.md). */
export interface MqttConfig {
  /** TCP host:port (127.0.0.1:1883 when the section has neither this nor `socket`). */
  listen: string | undefined;
  /** Unix socket path. */
  socket: string | undefined;
  /** MQTT over TLS, host:port (8883 by convention), with the agent's tls.{cert,key,ca}. */
  tlsListen: string | undefined;
  /** MQTT over WebSocket, host:port. */
  wsListen: string | undefined;
  /** MQTT over WebSocket over TLS, host:port. */
  wssListen: string | undefined;
  maxClients: number;
  /** Unacknowledged QoS 1 messages sent to one client at most. */
  maxInflight: number;
  maxPacketBytes: number;
  /** Envelope type of messages published over MQTT. */
  payloadType: string;
  /**
   * How long a persistent session outlives its connection at most: what a
   * 3.1.1 session (clean session 0) gets, and the cap on what an MQTT 5
   * client asks for.
   */
  sessionExpiryMs: number;
  /** QoS 1 and 2 publishes one client may have unacknowledged (MQTT 5 Receive Maximum; more ends its connection). */
  receiveMaximum: number;
  /** Longest keep-alive a client gets, seconds (0: what it asks); MQTT 5 clients are told (Server Keep Alive). */
  maxKeepaliveS: number;
  /** When not empty, clients must log in as one of these and keep to its rules. */
  users: MqttUser[];
}

/**
 * An MQTT login and the channel patterns the user may use: a password hash
 * (`keyop passwd`), or none for a user who logs in with a client
 * certificate of that CN only (over TLS).
 */
export interface MqttUser {
  name: string;
  passwordHash: string | undefined;
  publish: string[];
  subscribe: string[];
}

/** Command-line values that win over the file. */
export interface ConfigOverrides {
  dataDir?: string | undefined;
  socket?: string | undefined;
  logLevel?: string | undefined;
}

/** The lowest bandwidth cap accepted: below it one heartbeat period would not carry a small batch. */
const MIN_BYTES_PER_S = 256;

const TOP = ["name", "storage", "subscribers", "api", "tls", "hub", "links", "federation", "dedup", "audit", "log", "mqtt", "channels", "dashboard"] as const;

/**
 * Validates a parsed YAML document (or `undefined` for "no config") and
 * applies defaults and overrides. Throws `ConfigError` listing every problem.
 */
export function parseConfig(raw: unknown, overrides: ConfigOverrides = {}): AgentConfig {
  const r = new Reader();
  const top = r.obj(raw, "", TOP) ?? {};
  const name = r.name(top.name, "name");

  const storage = r.obj(top.storage, "storage", ["data_dir", "sync", "sync_interval_ms", "segment_bytes", "retention"]) ?? {};
  const retention = r.obj(storage.retention, "storage.retention", ["max_age", "max_bytes"]) ?? {};
  const dataDir = overrides.dataDir ?? r.str(storage.data_dir, "storage.data_dir") ?? DEFAULT_DATA_DIR;

  const subs = r.obj(top.subscribers, "subscribers", ["max_retries", "retry_backoff_base_ms", "retry_backoff_max_ms"]) ?? {};
  const api = r.obj(top.api, "api", ["socket", "socket_mode", "max_message_bytes", "metrics_listen"]) ?? {};

  const tlsRaw = r.obj(top.tls, "tls", ["cert", "key", "ca"]);
  let tls: AgentConfig["tls"];
  if (tlsRaw) {
    const cert = r.required(tlsRaw.cert, "tls.cert", r.str, " when tls is set");
    const key = r.required(tlsRaw.key, "tls.key", r.str, " when tls is set");
    const ca = r.required(tlsRaw.ca, "tls.ca", r.str, " when tls is set");
    if (cert && key && ca) tls = { cert, key, ca };
  }

  const hubRaw = r.obj(top.hub, "hub", ["listen", "peers", "jetstream"]);
  let hub: AgentConfig["hub"];
  if (hubRaw) {
    const listen = r.required(hubRaw.listen, "hub.listen", r.hostPort, " when hub is set");
    const seen = new Set<string>();
    const peers: PeerConfig[] = [];
    r.list(hubRaw.peers, "hub.peers").forEach((p, i) => {
      const path = `hub.peers[${i}]`;
      const o = r.obj(p, path, ["name", "publish", "subscribe", "max_bytes_per_s"]);
      if (!o) {
        r.fail(path, "must be a mapping");
        return;
      }
      const pname = r.required(o.name, `${path}.name`, r.name);
      if (pname && seen.has(pname)) r.fail(`${path}.name`, `duplicate peer "${pname}"`);
      if (pname) seen.add(pname);
      const subscribeLanes = r.priorityRules(o.subscribe, `${path}.subscribe`);
      const peer: PeerConfig = {
        name: pname ?? "",
        publish: r.patterns(o.publish, `${path}.publish`),
        subscribe: subscribeLanes.map((x) => x.pattern),
        subscribeLanes,
        maxBytesPerS: r.size(o.max_bytes_per_s, `${path}.max_bytes_per_s`, MIN_BYTES_PER_S),
      };
      if (pname) peers.push(peer);
    });
    const jetstream = hubRaw.jetstream === undefined || hubRaw.jetstream === null ? undefined : readJetStream(r, hubRaw.jetstream, peers);
    if (listen) hub = { listen, peers, jetstream };
  }

  const links: LinkConfig[] = [];
  r.list(top.links, "links").forEach((l, i) => {
    const path = `links[${i}]`;
    const o = r.obj(l, path, ["hub", "publish", "subscribe", "start", "max_bytes_per_s"]);
    if (!o) {
      r.fail(path, "must be a mapping");
      return;
    }
    const hubs = r.required(o.hub, `${path}.hub`, r.hostPorts);
    const publishLanes = r.priorityRules(o.publish, `${path}.publish`);
    const link: LinkConfig = {
      hubs: hubs ?? [],
      publish: publishLanes.map((x) => x.pattern),
      publishLanes,
      maxBytesPerS: r.size(o.max_bytes_per_s, `${path}.max_bytes_per_s`, MIN_BYTES_PER_S),
      subscribe: r.patterns(o.subscribe, `${path}.subscribe`),
      start: r.oneOf(o.start, `${path}.start`, ["latest", "earliest"] as const) ?? "latest",
    };
    if (hubs) links.push(link);
  });
  if ((hubRaw || links.length > 0) && !tlsRaw) r.fail("tls", "is required for federation (hub or links)");

  const fed =
    r.obj(top.federation, "federation", ["reconnect_base_ms", "reconnect_max_ms", "reconnect_jitter", "heartbeat_ms", "max_batch_bytes", "window", "peer_expiry", "compression", "stall_heartbeats"]) ??
    {};
  const dedup = r.obj(top.dedup, "dedup", ["capacity"]) ?? {};
  const audit = r.obj(top.audit, "audit", ["path", "max_file_bytes", "max_files"]) ?? {};
  const log = r.obj(top.log, "log", ["level", "format"]) ?? {};
  let level = r.oneOf(log.level, "log.level", ["debug", "info", "warn", "error"] as const) ?? "info";
  if (overrides.logLevel !== undefined) {
    if (isLogLevel(overrides.logLevel)) level = overrides.logLevel;
    else r.fail("--log-level", "must be one of debug, info, warn, error");
  }

  const cfg: AgentConfig = {
    name,
    storage: {
      dataDir,
      sync: r.oneOf(storage.sync, "storage.sync", ["always", "interval", "none"] as const) ?? "always",
      syncIntervalMs: r.duration(storage.sync_interval_ms, "storage.sync_interval_ms") ?? 200,
      segmentBytes: r.size(storage.segment_bytes, "storage.segment_bytes", 4096) ?? 64 * 1024 * 1024,
      retention: { maxAgeMs: r.duration(retention.max_age, "storage.retention.max_age"), maxBytes: r.size(retention.max_bytes, "storage.retention.max_bytes") },
    },
    subscribers: {
      maxRetries: r.int(subs.max_retries, "subscribers.max_retries", 1, 1000) ?? 5,
      retryBackoffBaseMs: r.duration(subs.retry_backoff_base_ms, "subscribers.retry_backoff_base_ms") ?? 100,
      retryBackoffMaxMs: r.duration(subs.retry_backoff_max_ms, "subscribers.retry_backoff_max_ms") ?? 5000,
    },
    api: {
      socket: overrides.socket ?? r.str(api.socket, "api.socket") ?? `${dataDir.replace(/\/+$/, "")}/${SOCKET_NAME}`,
      socketMode: r.mode(api.socket_mode, "api.socket_mode") ?? 0o660,
      maxMessageBytes: r.size(api.max_message_bytes, "api.max_message_bytes", 64) ?? 1024 * 1024,
      metricsListen: api.metrics_listen === undefined ? undefined : r.hostPort(api.metrics_listen, "api.metrics_listen"),
    },
    tls,
    hub,
    links,
    federation: {
      reconnectBaseMs: r.duration(fed.reconnect_base_ms, "federation.reconnect_base_ms") ?? 500,
      reconnectMaxMs: r.duration(fed.reconnect_max_ms, "federation.reconnect_max_ms") ?? 60_000,
      reconnectJitter: r.fraction(fed.reconnect_jitter, "federation.reconnect_jitter") ?? 0.2,
      heartbeatMs: r.duration(fed.heartbeat_ms, "federation.heartbeat_ms", 100) ?? 10_000,
      maxBatchBytes: r.size(fed.max_batch_bytes, "federation.max_batch_bytes", 1024) ?? 1024 * 1024,
      window: r.int(fed.window, "federation.window", 1, 1024) ?? 8,
      peerExpiryMs: r.duration(fed.peer_expiry, "federation.peer_expiry", 60_000) ?? 7 * 86_400_000,
      compression: r.oneOf(fed.compression, "federation.compression", ["auto", "zstd", "deflate", "none"] as const) ?? "auto",
      stallHeartbeats: r.int(fed.stall_heartbeats, "federation.stall_heartbeats", 0, 1000) ?? 3,
    },
    dedup: { capacity: r.int(dedup.capacity, "dedup.capacity", 0, 100_000_000) ?? 100_000 },
    audit: {
      path: r.str(audit.path, "audit.path"),
      maxFileBytes: r.size(audit.max_file_bytes, "audit.max_file_bytes", 4096) ?? 10 * 1024 * 1024,
      maxFiles: r.int(audit.max_files, "audit.max_files", 1, 1000) ?? 5,
    },
    log: { level, format: r.oneOf(log.format, "log.format", ["json", "text"] as const) ?? "json" },
    mqtt: undefined,
    channels: [],
    dashboard: undefined,
  };
  r.list(top.channels, "channels").forEach((c, i) => {
    const path = `channels[${i}]`;
    const o = r.obj(c, path, ["pattern", "ttl", "max_bytes", "full_policy"]);
    if (!o) {
      r.fail(path, "must be a mapping");
      return;
    }
    const pattern = r.required(o.pattern, `${path}.pattern`, r.pattern);
    const policy: ChannelPolicy = {
      pattern: pattern ?? "",
      ttlMs: r.duration(o.ttl, `${path}.ttl`),
      maxBytes: r.size(o.max_bytes, `${path}.max_bytes`, 4096),
      fullPolicy: r.oneOf(o.full_policy, `${path}.full_policy`, ["reject", "drop_oldest", "latest"] as const),
    };
    if (policy.fullPolicy === "reject" && policy.maxBytes === undefined) r.fail(`${path}.max_bytes`, "is required with full_policy reject");
    if (pattern) cfg.channels.push(policy);
  });
  const mqttRaw = r.obj(top.mqtt, "mqtt", [
    "listen",
    "socket",
    "tls_listen",
    "ws_listen",
    "wss_listen",
    "max_clients",
    "max_inflight",
    "max_packet_bytes",
    "payload_type",
    "session_expiry",
    "max_keepalive",
    "receive_maximum",
    "users",
  ]);
  if (top.mqtt !== undefined && top.mqtt !== null) {
    const m = mqttRaw ?? {};
    const listen = m.listen === undefined ? undefined : r.hostPort(m.listen, "mqtt.listen");
    const socket = r.str(m.socket, "mqtt.socket");
    const tlsListen = m.tls_listen === undefined ? undefined : r.hostPort(m.tls_listen, "mqtt.tls_listen");
    const wsListen = m.ws_listen === undefined ? undefined : r.hostPort(m.ws_listen, "mqtt.ws_listen");
    const wssListen = m.wss_listen === undefined ? undefined : r.hostPort(m.wss_listen, "mqtt.wss_listen");
    for (const [key, v] of [
      ["mqtt.tls_listen", m.tls_listen],
      ["mqtt.wss_listen", m.wss_listen],
    ] as const) {
      if (v !== undefined && !cfg.tls) r.fail(key, "needs tls.cert, tls.key and tls.ca (the agent's certificate and the keyop CA)");
    }
    const none = [m.listen, m.socket, m.tls_listen, m.ws_listen, m.wss_listen].every((v) => v === undefined);
    cfg.mqtt = {
      // Nothing named: plain MQTT on the loopback, as before there were other listeners.
      listen: listen ?? (none ? "127.0.0.1:1883" : undefined),
      socket,
      tlsListen,
      wsListen,
      wssListen,
      maxClients: r.int(m.max_clients, "mqtt.max_clients", 1, 1_000_000) ?? 1000,
      maxInflight: r.int(m.max_inflight, "mqtt.max_inflight", 1, 65_535) ?? 64,
      maxPacketBytes: r.size(m.max_packet_bytes, "mqtt.max_packet_bytes", 64) ?? 1024 * 1024,
      payloadType: r.str(m.payload_type, "mqtt.payload_type") ?? "mqtt",
      sessionExpiryMs: r.duration(m.session_expiry, "mqtt.session_expiry", 1000) ?? 7 * 86_400_000,
      receiveMaximum: r.int(m.receive_maximum, "mqtt.receive_maximum", 1, 65_535) ?? 65_535,
      maxKeepaliveS: Math.floor((r.duration(m.max_keepalive, "mqtt.max_keepalive", 0) ?? 0) / 1000),
      users: [],
    };
    const seenUsers = new Set<string>();
    r.list(m.users, "mqtt.users").forEach((u, i) => {
      const path = `mqtt.users[${i}]`;
      const o = r.obj(u, path, ["name", "password_hash", "publish", "subscribe"]);
      if (!o) {
        r.fail(path, "must be a mapping");
        return;
      }
      const uname = r.required(o.name, `${path}.name`, r.str);
      const hash = r.str(o.password_hash, `${path}.password_hash`);
      if (hash !== undefined && !hash.startsWith("$")) r.fail(`${path}.password_hash`, "must be a hash made by keyop passwd (it starts with $)");
      if (uname && seenUsers.has(uname)) r.fail(`${path}.name`, `duplicate user "${uname}"`);
      if (uname) seenUsers.add(uname);
      if (uname) cfg.mqtt!.users.push({ name: uname, passwordHash: hash, publish: r.patterns(o.publish, `${path}.publish`), subscribe: r.patterns(o.subscribe, `${path}.subscribe`) });
    });
  }
  const dash = r.obj(top.dashboard, "dashboard", ["listen", "tls", "users", "offline_after"]);
  if (dash) {
    const listen = r.required(dash.listen, "dashboard.listen", r.hostPort, " when dashboard is set");
    const tlsOn = r.bool(dash.tls, "dashboard.tls") ?? false;
    if (tlsOn && !cfg.tls) r.fail("dashboard.tls", "needs tls.cert, tls.key and tls.ca (the agent's certificate and the keyop CA)");
    const users: DashboardConfig["users"] = [];
    r.list(dash.users, "dashboard.users").forEach((u, i) => {
      const path = `dashboard.users[${i}]`;
      const o = r.obj(u, path, ["name", "password_hash"]);
      if (!o) {
        r.fail(path, "must be a mapping");
        return;
      }
      const uname = r.required(o.name, `${path}.name`, r.str);
      const hash = r.required(o.password_hash, `${path}.password_hash`, r.str);
      if (hash !== undefined && !hash.startsWith("$")) r.fail(`${path}.password_hash`, "must be a hash made by keyop passwd (it starts with $)");
      if (uname && hash) users.push({ name: uname, passwordHash: hash });
    });
    const host = listen ? listen.slice(0, listen.lastIndexOf(":")).replace(/^\[|\]$/g, "") : "";
    const loopback = host === "localhost" || host === "::1" || /^127\./.test(host);
    if (listen && !loopback && !tlsOn && users.length === 0)
      r.fail("dashboard.listen", "is not a loopback address: set dashboard.tls (client certificates from the keyop CA) or dashboard.users (logins)");
    const offline = r.duration(dash.offline_after, "dashboard.offline_after") ?? 300_000;
    if (listen) cfg.dashboard = { listen, tls: tlsOn, users, offlineAfterMs: offline };
  }
  if (cfg.subscribers.retryBackoffMaxMs < cfg.subscribers.retryBackoffBaseMs) {
    r.fail("subscribers.retry_backoff_max_ms", "must not be less than retry_backoff_base_ms");
  }
  if (cfg.federation.reconnectMaxMs < cfg.federation.reconnectBaseMs) {
    r.fail("federation.reconnect_max_ms", "must not be less than reconnect_base_ms");
  }
  if (r.problems.length > 0) throw new ConfigError(r.problems);
  return cfg;
}

/** Reads and validates a YAML config file; a missing path means defaults. */
export async function loadConfig(path: string | undefined, overrides: ConfigOverrides = {}): Promise<AgentConfig> {
  if (path === undefined) return parseConfig(undefined, overrides);
  let text: string;
  try {
    text = await Bun.file(path).text();
  } catch (err) {
    throw new ConfigError([`${path}: cannot read: ${(err as Error).message}`]);
  }
  let raw: unknown;
  try {
    raw = Bun.YAML.parse(text);
  } catch (err) {
    throw new ConfigError([`${path}: not valid YAML: ${(err as Error).message}`]);
  }
  return parseConfig(raw ?? undefined, overrides);
}
