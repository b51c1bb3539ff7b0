/**
 * The JetStream engine against a real 3-node cluster: streams provisioned
 * and brought back to the configuration, records stored once by id, the
 * JSON format and headers for readers outside keyop, and what a session
 * reads (its own consumer while behind, the live feed once caught up).
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { connect, type NatsConnection } from "nats";
import type { JetStreamConfig } from "../../src/config/jetstream.ts";
import { decodeEnvelope, encodeEnvelope } from "../../src/envelope/envelope.ts";
import { JetStreamEngine } from "../../src/jetstream/engine.ts";
import { downRecord } from "../../src/jetstream/foreign.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { freePort, tmpDir } from "../helpers.ts";
import { NatsCluster } from "./nats-cluster.ts";

let cluster: NatsCluster;
let nc: NatsConnection;
const engines: JetStreamEngine[] = [];

function config(over: Partial<JetStreamConfig> = {}): JetStreamConfig {
  return {
    servers: cluster.servers,
    tls: undefined,
    user: undefined,
    password: undefined,
    creds: undefined,
    subjectPrefix: "kp",
    streams: [{ name: "T", channels: ["t.>"], replicas: 3, maxAgeMs: undefined, maxBytes: undefined }],
    duplicateWindowMs: 60_000,
    headers: false,
    format: "msgpack",
    ...over,
  };
}

async function engine(over: Partial<JetStreamConfig> = {}): Promise<JetStreamEngine> {
  const e = new JetStreamEngine(config(over), silentLogger);
  engines.push(e);
  e.start();
  await e.ready(AbortSignal.timeout(30_000));
  return e;
}

const record = (channel: string, payload: unknown) => {
  const id = Bun.randomUUIDv7();
  return { id, body: encodeEnvelope({ id, ts: 1_700_000_000_000, channel, origin: "board", type: "n", correlationId: "c-9", route: ["board", "hub"], payload }) };
};

beforeAll(async () => {
  cluster = await NatsCluster.start(join(tmpDir(), "nats"));
  nc = await cluster.client();
}, 60_000);

afterAll(async () => {
  for (const e of engines) await e.close();
  await nc?.close();
  await cluster?.stop();
});

describe("JetStreamEngine", () => {
  test("a stream changed by hand is brought back to the configuration when a hub starts", async () => {
    await engine();
    const jsm = await nc.jetstreamManager();
    await jsm.streams.update("T", { subjects: ["kp.t.>", "kp.extra.>"], max_age: 0 });
    await engine({ streams: [{ name: "T", channels: ["t.>"], replicas: 3, maxAgeMs: 3_600_000, maxBytes: undefined }] });
    const c = (await jsm.streams.info("T")).config;
    expect(c.subjects).toEqual(["kp.t.>"]);
    expect(c.max_age).toBe(3_600_000 * 1e6);
  }, 60_000);

  test("a record stored twice under one id is in the stream once; the second is counted as a duplicate", async () => {
    const e = await engine();
    const jsm = await nc.jetstreamManager();
    const before = (await jsm.streams.info("T")).state.messages;
    const r = record("t.dup", 1);
    await e.store("t.dup", [r]);
    await e.store("t.dup", [r]);
    expect((await jsm.streams.info("T")).state.messages).toBe(before + 1);
    expect(e.stats).toMatchObject({ stored: 1, duplicates: 1 });
  }, 30_000);

  test("format json and headers: readers outside keyop get the API's JSON and the labels; boards get the envelope back", async () => {
    const e = await engine({ format: "json", headers: true });
    const r = record("t.json", { bytes: new Uint8Array([1, 2, 255]), n: 7 });
    await e.store("t.json", [r]);
    const jsm = await nc.jetstreamManager();
    const m = await jsm.streams.getMessage("T", { last_by_subj: "kp.t.json" });
    const text = new TextDecoder().decode(m.data);
    expect(JSON.parse(text)).toEqual({
      v: 1,
      id: r.id,
      ts: 1_700_000_000_000,
      channel: "t.json",
      origin: "board",
      type: "n",
      correlation_id: "c-9",
      route: ["board", "hub"],
      payload: { bytes: { $base64: "AQL/" }, n: 7 },
    });
    expect(m.header.get("Keyop-Type")).toBe("n");
    expect(m.header.get("Keyop-Origin")).toBe("board");
    expect(m.header.get("Keyop-Correlation-Id")).toBe("c-9");
    expect(m.header.get("Nats-Msg-Id")).toBe(r.id);
    const down = downRecord(
      { subject: m.subject, data: m.data, seq: m.seq, timestampMs: 0, header: (n) => m.header.get(n) || undefined },
      { prefix: "kp", stream: "T", tier: "hub", maxBytes: 1 << 20 },
    );
    if ("skip" in down) throw new Error(down.skip);
    expect(down.id).toBe(r.id);
    expect(decodeEnvelope(down.body, 0)).toEqual(decodeEnvelope(r.body, 0));
  }, 30_000);

  test("a reader catches up on a consumer of its own, then reads the live feed; its consumer is deleted", async () => {
    const e = await engine();
    const jsm = await nc.jetstreamManager();
    const first = await e.bounds("T");
    for (let i = 0; i < 5; i++) await e.store("t.read", [record("t.read", i)]);
    const ctl = new AbortController();
    const got: number[] = [];
    const reading = (async () => {
      for await (const m of e.read("T", first.last + 1, "kp.t.read", ctl.signal)) got.push(decodeEnvelope(m.data, 0).payload as number);
    })();
    const until = async (cond: () => boolean | Promise<boolean>) => {
      const end = performance.now() + 10_000;
      while (!(await cond())) {
        if (performance.now() > end) throw new Error("timed out");
        await Bun.sleep(20);
      }
    };
    await until(() => got.length === 5);
    const filtered = async () => {
      let n = 0;
      for await (const ci of jsm.consumers.list("T")) if (ci.config.filter_subject === "kp.t.read") n++;
      return n;
    };
    await until(async () => (await filtered()) === 0);
    // The reader joins the feed once its consumer's deletion has returned, a moment after the server shows it gone.
    await until(() => e.stats.live > 0);
    for (let i = 5; i < 8; i++) await e.store("t.read", [record("t.read", i)]);
    await until(() => got.length === 8);
    expect(got).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    ctl.abort();
    await reading;
  }, 30_000);
});

describe("JetStreamEngine: a slow reader on the live feed", () => {
  test("falls behind the feed by more than its tap holds, reads its own consumer again, and misses nothing, in order, once", async () => {
    const e = await engine();
    const { last } = await e.bounds("T");
    const ctl = new AbortController();
    const got: number[] = [];
    let slow = true;
    const reading = (async () => {
      for await (const m of e.read("T", last + 1, "kp.t.slow", ctl.signal)) {
        got.push(decodeEnvelope(m.data, 0).payload as number);
        if (slow) await Bun.sleep(2); // a board whose link is slower than what arrives
      }
    })();
    // Caught up at once (nothing stored yet): the reader is on the live feed.
    const until = async (cond: () => boolean, what: string, ms = 30_000) => {
      const end = performance.now() + ms;
      while (!cond()) {
        if (performance.now() > end) throw new Error(`timed out: ${what}`);
        await Bun.sleep(20);
      }
    };
    await until(() => e.stats.live > 0, "on the live feed");
    const catchUps = e.stats.catchUps;
    const N = 4000;
    const batch: ReturnType<typeof record>[] = [];
    for (let i = 0; i < N; i++) batch.push(record("t.slow", i));
    for (let i = 0; i < N; i += 500) await e.store("t.slow", batch.slice(i, i + 500));
    await until(() => got.length >= 1500, "some read slowly");
    slow = false;
    await until(() => got.length >= N, "all read");
    await Bun.sleep(200);
    expect(got).toEqual(Array.from({ length: N }, (_, i) => i));
    // It overflowed its tap (1,024) and caught up on a consumer of its own, then went live again.
    expect(e.stats.catchUps).toBeGreaterThan(catchUps);
    ctl.abort();
    await reading;
  }, 60_000);
});

describe("JetStreamEngine: credentials and TLS towards NATS", () => {
  /** A single nats-server with JetStream and `extra` config; stopped after `fn`. */
  async function withServer(extra: string, fn: (url: string) => Promise<void>): Promise<void> {
    const dir = tmpDir();
    const port = freePort();
    const conf = join(dir, "nats.conf");
    await Bun.write(conf, `listen: 127.0.0.1:${port}\njetstream { store_dir: "${join(dir, "js")}" }\n${extra}\n`);
    const proc = Bun.spawn([Bun.which("nats-server", { PATH: `/usr/sbin:/usr/bin:${process.env.PATH}` }) ?? "nats-server", "-c", conf], { stdout: "ignore", stderr: "ignore" });
    try {
      const end = performance.now() + 10_000;
      while (performance.now() < end) {
        const ok = await Bun.connect({ hostname: "127.0.0.1", port, socket: { data() {} } }).then(
          (s) => (s.end(), true),
          () => false,
        );
        if (ok) break;
        await Bun.sleep(50);
      }
      await fn(`nats://127.0.0.1:${port}`);
    } finally {
      proc.kill("SIGKILL");
      await proc.exited;
    }
  }
  const one = [{ name: "A", channels: ["a.>"], replicas: 1, maxAgeMs: undefined, maxBytes: undefined }];

  test("user and password: the right ones store, wrong ones leave the engine unavailable with the reason", async () => {
    await withServer("authorization { user: keyop, password: s3cret }", async (url) => {
      const good = new JetStreamEngine(config({ servers: [url], user: "keyop", password: "s3cret", streams: one }), silentLogger);
      engines.push(good);
      good.start();
      await good.ready(AbortSignal.timeout(15_000));
      await good.store("a.x", [record("a.x", 1)]);
      expect(good.stats.stored).toBe(1);
      const bad = new JetStreamEngine(config({ servers: [url], user: "keyop", password: "wrong", streams: one }), silentLogger);
      engines.push(bad);
      bad.start();
      const end = performance.now() + 10_000;
      while (bad.state !== "unavailable" && performance.now() < end) await Bun.sleep(50);
      expect(bad.state).toBe("unavailable");
      expect(bad.unavailable()).toMatch(/auth/i);
    });
  }, 40_000);

  test("mutual TLS to the NATS servers with the configured certificate, key and CA", async () => {
    const { createCa, issueCert } = await import("../../src/pki/certs.ts");
    const dir = tmpDir();
    const ca = await createCa();
    const server = await issueCert(ca, { name: "localhost", ip: ["127.0.0.1"] });
    const client = await issueCert(ca, { name: "keyop-hub" });
    const f = (n: string, text: string) => {
      const p = join(dir, n);
      writeFileSync(p, text);
      return p;
    };
    const caFile = f("ca.crt", ca.certPem);
    await withServer(`tls { cert_file: "${f("s.crt", server.certPem)}", key_file: "${f("s.key", server.keyPem)}", ca_file: "${caFile}", verify: true }`, async (url) => {
      const e = new JetStreamEngine(
        config({ servers: [url.replace("nats://", "tls://")], tls: { cert: f("c.crt", client.certPem), key: f("c.key", client.keyPem), ca: caFile }, streams: one }),
        silentLogger,
      );
      engines.push(e);
      e.start();
      await e.ready(AbortSignal.timeout(15_000));
      await e.store("a.tls", [record("a.tls", 1)]);
      expect(e.stats.stored).toBe(1);
    });
  }, 40_000);
});

describe("JetStreamEngine: a cluster that loses its quorum", () => {
  test("is unavailable while no meta leader answers, and stays so though the server left still answers stream info; available again once the cluster is back", async () => {
    const c = await NatsCluster.start(join(tmpDir(), "nats-quorum"));
    try {
      const e = new JetStreamEngine({ ...config(), servers: c.servers }, silentLogger, { healthMs: 300, probeMs: 150 });
      engines.push(e);
      const seen: string[] = [];
      e.onState((s) => seen.push(s));
      e.start();
      await e.ready(AbortSignal.timeout(30_000));
      await c.stopNode("n1");
      await c.stopNode("n2");
      // The server left may have been the meta leader, which goes on answering until it sees it lost
      // its quorum; from the moment it says so (503), the engine must follow and stay unavailable.
      const own = await connect({ servers: [`127.0.0.1:${c.node("n3").port}`] });
      const ownJsm = await own.jetstreamManager({ checkAPI: false, timeout: 1000 });
      const end = performance.now() + 60_000;
      while (
        performance.now() < end &&
        (await ownJsm.getAccountInfo().then(
          () => true,
          (err) => !/503/.test(String(err)),
        ))
      )
        await Bun.sleep(100);
      await own.close();
      while (e.state === "available" && performance.now() < end) await Bun.sleep(50);
      expect(e.state).toBe("unavailable");
      // The server left answers a stream's info from its own copy: a probe that took that for
      // health would call the engine available again within a probe or two (150 ms each).
      const from = seen.length;
      const watchUntil = performance.now() + 5_000;
      while (performance.now() < watchUntil) await Bun.sleep(100);
      expect(seen.slice(from)).not.toContain("available");
      expect(e.unavailable()).toBeTruthy();
      c.startNode("n1");
      c.startNode("n2");
      await e.ready(AbortSignal.timeout(60_000));
      expect(e.state).toBe("available");
    } finally {
      await c.stop();
    }
  }, 150_000);
});
