import { describe, expect, test } from "bun:test";
import { parseConfig } from "../../src/config/schema.ts";
import { ConfigError } from "../../src/errors.ts";
import { natsStreamConfig } from "../../src/jetstream/engine.ts";

const TLS = { cert: "c.crt", key: "c.key", ca: "ca.crt" };

function hubWith(jetstream: unknown, peers: unknown[] = [{ name: "board", publish: ["telemetry.>"], subscribe: ["cmd.board.>"] }]) {
  return { tls: TLS, hub: { listen: "0.0.0.0:7740", peers, jetstream } };
}

function problems(raw: unknown): string[] {
  try {
    parseConfig(raw);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return [...(err as ConfigError).problems];
  }
  throw new Error("expected a ConfigError");
}

const STREAMS = [
  { name: "TELEMETRY", channels: ["telemetry.>"], replicas: 3, max_age: "7d", max_bytes: "50GiB" },
  { name: "CMD", channels: ["cmd.>"], max_age: "7d" },
];

describe("hub.jetstream", () => {
  test("the issue's example reads with its defaults", () => {
    const c = parseConfig(hubWith({ servers: ["nats://10.0.0.5:4222", "nats://10.0.0.6:4222"], subject_prefix: "kp", streams: STREAMS, duplicate_window: "10m" }));
    const js = c.hub!.jetstream!;
    expect(js.servers).toEqual(["nats://10.0.0.5:4222", "nats://10.0.0.6:4222"]);
    expect(js.subjectPrefix).toBe("kp");
    expect(js.duplicateWindowMs).toBe(600_000);
    expect(js.headers).toBe(false);
    expect(js.format).toBe("msgpack");
    expect(js.streams).toEqual([
      { name: "TELEMETRY", channels: ["telemetry.>"], replicas: 3, maxAgeMs: 7 * 86_400_000, maxBytes: 50 * 2 ** 30 },
      { name: "CMD", channels: ["cmd.>"], replicas: 3, maxAgeMs: 7 * 86_400_000, maxBytes: undefined },
    ]);
  });

  test("format: msgpack or json, nothing else", () => {
    expect(parseConfig(hubWith({ servers: ["nats://h:4222"], streams: STREAMS, format: "json" })).hub!.jetstream!.format).toBe("json");
    expect(problems(hubWith({ servers: ["nats://h:4222"], streams: STREAMS, format: "xml" }))).toEqual(["hub.jetstream.format: must be one of msgpack, json"]);
  });

  test("a hub without jetstream is as before", () => {
    expect(parseConfig(hubWith(undefined)).hub!.jetstream).toBeUndefined();
  });

  test("a peer rule no stream covers is refused at start, naming the pattern", () => {
    const p = problems(hubWith({ servers: ["nats://h:4222"], streams: STREAMS }, [{ name: "board", publish: ["telemetry.>", "logs.>"], subscribe: [">"] }]));
    expect(p).toContain('hub.peers[0].publish: "logs.>" of peer board is not covered by any one stream of hub.jetstream.streams');
    expect(p).toContain('hub.peers[0].subscribe: ">" of peer board is not covered by any one stream of hub.jetstream.streams');
  });

  test("overlapping streams, a max_age under the duplicate window, bad names and servers are each reported", () => {
    const p = problems(
      hubWith(
        {
          servers: ["http://h:4222", "nats://ok:4222"],
          subject_prefix: "k p",
          duplicate_window: "1h",
          streams: [
            { name: "A", channels: ["telemetry.>"] },
            { name: "A", channels: ["telemetry.*.temp", "cmd.>"], max_age: "10m" },
            { name: "bad.name", channels: [] },
          ],
        },
        [],
      ),
    );
    expect(p).toEqual(
      expect.arrayContaining([
        "hub.jetstream.servers[0]: must be nats://host:port (or tls://host:port)",
        "hub.jetstream.subject_prefix: must be subject tokens of [A-Za-z0-9_-] separated by dots",
        'hub.jetstream.streams[1].name: duplicate stream "A"',
        "hub.jetstream.streams[1].max_age: must not be shorter than hub.jetstream.duplicate_window",
        "hub.jetstream.streams[2].name: must be letters, digits, _ and - (a JetStream stream name)",
        "hub.jetstream.streams[2].channels: must list at least one channel pattern",
        'hub.jetstream.streams[1].channels: "telemetry.*.temp" overlaps "telemetry.>" of stream A',
      ]),
    );
  });

  test("credentials: user and password together, not with creds; tls cert and key together", () => {
    const p = problems(hubWith({ servers: ["nats://h:4222"], streams: STREAMS, user: "u", creds: "/x.creds", tls: { cert: "c" } }));
    expect(p).toEqual(
      expect.arrayContaining([
        "hub.jetstream.user: user and password go together",
        "hub.jetstream.creds: use either creds or user and password, not both",
        "hub.jetstream.tls: cert and key go together",
      ]),
    );
  });

  test("a link may list the hubs of a tier; an empty list or a bad address is refused", () => {
    const c = parseConfig({ tls: TLS, links: [{ hub: ["a:7740", "b:7740"], publish: ["t.>"] }, { hub: "c:7740" }] });
    expect(c.links.map((l) => l.hubs)).toEqual([["a:7740", "b:7740"], ["c:7740"]]);
    expect(problems({ tls: TLS, links: [{ hub: [] }, { hub: ["a:1", "nope"] }] })).toEqual(["links[0].hub: must be host:port or a non-empty list of them", "links[1].hub[1]: must be host:port"]);
  });

  test("the stream JetStream is asked for: subjects under the prefix, R, limits and the window in nanoseconds", () => {
    const c = parseConfig(hubWith({ servers: ["nats://h:4222"], streams: STREAMS, duplicate_window: "2m" })).hub!.jetstream!;
    expect(natsStreamConfig(c.streams[0]!, c)).toMatchObject({
      name: "TELEMETRY",
      subjects: ["kp.telemetry.>"],
      num_replicas: 3,
      max_age: 7 * 86_400_000 * 1e6,
      max_bytes: 50 * 2 ** 30,
      duplicate_window: 120_000 * 1e6,
    });
    expect(natsStreamConfig(c.streams[1]!, c)).toMatchObject({ max_bytes: -1 });
  });
});
