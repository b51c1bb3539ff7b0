/**
 * `hub.jetstream` (docs/scale-out.md): the NATS JetStream cluster a hub tier
 * stores in instead of its own log. Checked at start, with every problem
 * reported: a peer rule that no stream covers would otherwise surface as
 * refused publishes in production, not as a config error.
 */
import { patternsOverlap, uncovered } from "../envelope/patterns.ts";
import type { Reader } from "./reader.ts";

/** What the stream checks need of a peer (hub.peers[]). */
interface PeerRules {
  name: string;
  publish: string[];
  subscribe: string[];
}

/** One stream the hub provisions and stores channels in. */
export interface StreamConfig {
  name: string;
  /** keyop patterns of the channels it holds (subjects: the prefix + each pattern). */
  channels: string[];
  replicas: number;
  maxAgeMs: number | undefined;
  maxBytes: number | undefined;
}

/** The JetStream engine of a hub tier. */
export interface JetStreamConfig {
  /** nats://host:port (or tls://, or host:port) of the cluster's servers. */
  servers: string[];
  /** Client certificate, key and CA for the NATS connection (files). */
  tls: { cert: string | undefined; key: string | undefined; ca: string | undefined } | undefined;
  user: string | undefined;
  password: string | undefined;
  /** A NATS credentials file (JWT and seed). */
  creds: string | undefined;
  subjectPrefix: string;
  streams: StreamConfig[];
  /** How long JetStream remembers a message id to drop a second copy. */
  duplicateWindowMs: number;
  /** Headers on every stored message for readers outside keyop (type, origin, correlation id). */
  headers: boolean;
  /** How envelopes are stored: as keyop stores them (msgpack), or as the HTTP API's JSON. */
  format: "msgpack" | "json";
}

const KEYS = ["servers", "tls", "user", "password", "creds", "subject_prefix", "streams", "duplicate_window", "headers", "format"] as const;
const TOKEN = /^[A-Za-z0-9_-]+$/;

/** Reads `hub.jetstream`; `peers` are checked against the streams. */
export function readJetStream(r: Reader, raw: unknown, peers: PeerRules[]): JetStreamConfig | undefined {
  const path = "hub.jetstream";
  const o = r.obj(raw, path, KEYS);
  if (!o) return undefined;
  const servers = r.list(o.servers, `${path}.servers`).map((s, i) => {
    const v = r.str(s, `${path}.servers[${i}]`);
    if (v !== undefined && !/^((nats|tls):\/\/)?[^\s/]+:\d{1,5}$/.test(v)) r.fail(`${path}.servers[${i}]`, "must be nats://host:port (or tls://host:port)");
    return v ?? "";
  });
  if (servers.length === 0) r.fail(`${path}.servers`, "must list at least one server");

  const tlsRaw = r.obj(o.tls, `${path}.tls`, ["cert", "key", "ca"]);
  const tls = tlsRaw ? { cert: r.str(tlsRaw.cert, `${path}.tls.cert`), key: r.str(tlsRaw.key, `${path}.tls.key`), ca: r.str(tlsRaw.ca, `${path}.tls.ca`) } : undefined;
  if (tls && (tls.cert === undefined) !== (tls.key === undefined)) r.fail(`${path}.tls`, "cert and key go together");

  const user = r.str(o.user, `${path}.user`);
  const password = r.str(o.password, `${path}.password`);
  const creds = r.str(o.creds, `${path}.creds`);
  if ((user === undefined) !== (password === undefined)) r.fail(`${path}.user`, "user and password go together");
  if (creds !== undefined && user !== undefined) r.fail(`${path}.creds`, "use either creds or user and password, not both");

  const subjectPrefix = r.str(o.subject_prefix, `${path}.subject_prefix`) ?? "kp";
  if (!subjectPrefix.split(".").every((t) => TOKEN.test(t))) r.fail(`${path}.subject_prefix`, "must be subject tokens of [A-Za-z0-9_-] separated by dots");

  const duplicateWindowMs = r.duration(o.duplicate_window, `${path}.duplicate_window`, 1000) ?? 600_000;
  const streams: StreamConfig[] = [];
  const names = new Set<string>();
  r.list(o.streams, `${path}.streams`).forEach((s, i) => {
    const sp = `${path}.streams[${i}]`;
    const so = r.obj(s, sp, ["name", "channels", "replicas", "max_age", "max_bytes"]);
    if (!so) {
      r.fail(sp, "must be a mapping");
      return;
    }
    const name = r.required(so.name, `${sp}.name`, r.str);
    if (name !== undefined && !TOKEN.test(name)) r.fail(`${sp}.name`, "must be letters, digits, _ and - (a JetStream stream name)");
    if (name !== undefined && names.has(name)) r.fail(`${sp}.name`, `duplicate stream "${name}"`);
    if (name !== undefined) names.add(name);
    const channels = r.patterns(so.channels, `${sp}.channels`);
    if (channels.length === 0) r.fail(`${sp}.channels`, "must list at least one channel pattern");
    const stream: StreamConfig = {
      name: name ?? "",
      channels,
      replicas: r.int(so.replicas, `${sp}.replicas`, 1, 5) ?? 3,
      maxAgeMs: r.duration(so.max_age, `${sp}.max_age`, 1000),
      maxBytes: r.size(so.max_bytes, `${sp}.max_bytes`),
    };
    if (stream.maxAgeMs !== undefined && stream.maxAgeMs < duplicateWindowMs) r.fail(`${sp}.max_age`, "must not be shorter than hub.jetstream.duplicate_window");
    streams.push(stream);
  });
  if (streams.length === 0) r.fail(`${path}.streams`, "must list at least one stream");

  // JetStream refuses a subject in two streams; say which patterns, before the cluster does.
  for (let a = 0; a < streams.length; a++) {
    for (let b = a + 1; b < streams.length; b++) {
      for (const pa of streams[a]!.channels) {
        for (const pb of streams[b]!.channels) {
          if (patternsOverlap(pa, pb)) r.fail(`${path}.streams[${b}].channels`, `"${pb}" overlaps "${pa}" of stream ${streams[a]!.name}`);
        }
      }
    }
  }
  const covering = streams.flatMap((s) => s.channels);
  peers.forEach((p, i) => {
    for (const dir of ["publish", "subscribe"] as const) {
      for (const rule of uncovered(covering, p[dir])) {
        r.fail(`hub.peers[${i}].${dir}`, `"${rule}" of peer ${p.name} is not covered by any one stream of hub.jetstream.streams`);
      }
    }
  });
  return {
    servers,
    tls,
    user,
    password,
    creds,
    subjectPrefix,
    streams,
    duplicateWindowMs,
    format: r.oneOf(o.format, `${path}.format`, ["msgpack", "json"] as const) ?? "msgpack",
    headers: o.headers === undefined ? false : o.headers === true ? true : o.headers === false ? false : (r.fail(`${path}.headers`, "must be true or false") ?? false),
  };
}
