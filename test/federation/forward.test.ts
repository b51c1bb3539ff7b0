import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Messenger, compilePattern } from "../../src/index.ts";
import { encodeEnvelope } from "../../src/envelope/envelope.ts";
import { AuditLog } from "../../src/federation/audit.ts";
import { RecentIds } from "../../src/federation/dedup.ts";
import { cursorName, Forwarder } from "../../src/federation/forwarder.ts";
import type { Link } from "../../src/federation/link.ts";
import { FrameDecoder } from "../../src/federation/frame.ts";
import { batchFrame, parseBatch, type Ack } from "../../src/federation/messages.ts";
import { Receiver } from "../../src/federation/receiver.ts";
import { type PeerSession, sessionHandler } from "../../src/federation/session.ts";
import { createCa, issueCert } from "../../src/pki/certs.ts";
import { connectMtls, MtlsServer } from "../../src/pki/mtls.ts";
import { loadTlsMaterial, type TlsMaterial } from "../../src/pki/tls.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { messengerSink } from "../../src/federation/sink.ts";
import { tmpDir, waitFor } from "../helpers.ts";

let dir: string;
let hubM: Messenger;
let devM: Messenger;
let hubTls: TlsMaterial;
let devTls: TlsMaterial;
let server: MtlsServer<PeerSession>;
let audit: AuditLog;
const receivers = new Map<PeerSession, Receiver>();
const dedup = new RecentIds(100_000);
const PEER_PUBLISH: Record<string, string[]> = { devA: ["t.>"] };

beforeAll(async () => {
  dir = tmpDir();
  const ca = await createCa();
  writeFileSync(join(dir, "ca.crt"), ca.certPem);
  const save = async (name: string) => {
    const c = await issueCert(ca, { name, ip: ["127.0.0.1"] });
    writeFileSync(join(dir, `${name}.crt`), c.certPem);
    writeFileSync(join(dir, `${name}.key`), c.keyPem);
    return loadTlsMaterial({ cert: join(dir, `${name}.crt`), key: join(dir, `${name}.key`), ca: join(dir, "ca.crt") });
  };
  hubTls = await save("hub");
  devTls = await save("devA");
  hubM = await Messenger.open({ name: "hub", storage: { dataDir: join(dir, "hub") } });
  devM = await Messenger.open({ name: "devA", storage: { dataDir: join(dir, "devA") } });
  audit = new AuditLog({ path: join(dir, "audit.log"), maxFileBytes: 1 << 20, maxFiles: 2, logger: silentLogger });
  server = MtlsServer.listen<PeerSession>(
    { hostname: "127.0.0.1", port: 0, material: hubTls, logger: silentLogger, authorize: (p) => (PEER_PUBLISH[p.name] ? null : "unknown peer") },
    sessionHandler(
      { role: "hub", maxBody: 2 << 20, heartbeatMs: 5000, logger: silentLogger, audit },
      {
        onHello: (s, h) => {
          const allowed = PEER_PUBLISH[s.peer.name]!.map(compilePattern);
          receivers.set(s, new Receiver({ sink: messengerSink(hubM), self: "hub", dedup, logger: silentLogger, audit, allow: (c) => allowed.some((m) => m(c)) }));
          return { version: 1, name: "hub", publish: PEER_PUBLISH[s.peer.name]!, subscribe: [], heartbeatMs: 5000, maxBatchBytes: h.maxBatchBytes };
        },
        onBatch: (s, b) => receivers.get(s)!.handle(s, b),
      },
    ),
  );
});
afterAll(async () => {
  server.stop(true);
  await hubM.close();
  await devM.close();
});

/** Connects devA as a link sending `patterns`; resolves with its session and forwarder once open. */
async function link(patterns: string[]) {
  let fwd: Forwarder | undefined;
  let session: PeerSession | undefined;
  const acks: Ack[] = [];
  await connectMtls<PeerSession>(
    { hostname: "127.0.0.1", port: server.port, material: devTls, logger: silentLogger },
    sessionHandler(
      { role: "client", maxBody: 2 << 20, heartbeatMs: 5000, logger: silentLogger },
      {
        onOpen: (s) => {
          fwd = new Forwarder({ messenger: devM, session: s, patterns, start: "earliest", window: 8, maxBatchBytes: 64 * 1024, logger: silentLogger });
          void fwd.run();
        },
        onAck: (_s, a) => {
          acks.push(a);
          fwd?.onAck(a);
        },
        onClose: () => fwd?.stop(),
      },
      (s) => {
        session = s;
        s.sendHello({ versions: [1], name: "devA", mode: "link", publish: patterns, subscribe: [], heartbeatMs: 5000, maxBatchBytes: 64 * 1024 });
      },
    ),
  );
  await waitFor(() => fwd !== undefined, "link open");
  return { session: session!, fwd: fwd!, acks };
}

async function hubMessages(channel: string): Promise<{ id: string; route: string[]; origin: string; payload: unknown }[]> {
  const sub = hubM.openSubscriber(channel, `check-${Math.random().toString(36).slice(2)}`, { from: "earliest" });
  const out: { id: string; route: string[]; origin: string; payload: unknown }[] = [];
  while (true) {
    const got = await sub.fetch({ max: 10_000, after: new Map([[channel, (out.length ? out.length : 0) + 1]]) });
    if (got.length === 0) return out;
    out.push(...got);
  }
}

describe("store and forward between two messengers over mutual TLS", () => {
  test("a backlog published before the link existed arrives once, in order, with the route extended; cursors reach the end", async () => {
    for (let i = 0; i < 600; i++) await devM.publish(i % 2 ? "t.a" : "t.b", "n", { i });
    const l = await link(["t.>"]);
    await waitFor(async () => (await hubMessages("t.a")).length === 300 && (await hubMessages("t.b")).length === 300, "backlog at the hub", 20_000);
    const a = await hubMessages("t.a");
    expect(a.map((m) => (m.payload as { i: number }).i)).toEqual(Array.from({ length: 300 }, (_, k) => 2 * k + 1));
    expect(a[0]).toMatchObject({ origin: "devA", route: ["devA", "hub"] });
    await waitFor(() => devM.openSubscriber("t.>", cursorName("hub"), { create: false }).lag() === 0, "device cursor at the end");
    // live messages follow without a restart, including a channel created now
    await devM.publish("t.new", "n", { live: true });
    await waitFor(async () => (await hubMessages("t.new")).length === 1, "live message on a new channel");
    l.session.close("bye", "test");
  }, 30_000);

  test("the same batch twice: stored once, the second acked and audited as duplicates", async () => {
    const l = await link(["nothing.here"]);
    const body = (id: string) => encodeEnvelope({ id, ts: Date.now(), channel: "t.dup", origin: "devA", type: "n", route: ["devA"], payload: id });
    const frame = batchFrame({ batch: 1, channel: "t.dup", seqs: [1, 2], records: [body("dup-1"), body("dup-2")] });
    l.session.send(frame);
    l.session.send(batchFrame({ batch: 2, channel: "t.dup", seqs: [1, 2], records: [body("dup-1"), body("dup-2")] }));
    await waitFor(() => l.acks.length === 2, "both batches acked");
    expect((await hubMessages("t.dup")).map((m) => m.id)).toEqual(["dup-1", "dup-2"]);
    await audit.flush();
    expect(readFileSync(join(dir, "audit.log"), "utf8").match(/"event":"duplicate_dropped"/g)?.length).toBe(2);
    l.session.close("bye", "test");
  });

  test("outside the publish rules, or already through the hub: dropped, audited, still acked", async () => {
    const l = await link(["nothing.here"]);
    const body = (channel: string, id: string, route: string[]) => encodeEnvelope({ id, ts: Date.now(), channel, origin: "devA", type: "n", route, payload: null });
    l.session.send(batchFrame({ batch: 1, channel: "secret.x", seqs: [5], records: [body("secret.x", "s-1", ["devA"])] }));
    l.session.send(batchFrame({ batch: 2, channel: "t.loop", seqs: [9], records: [body("t.loop", "l-1", ["x", "hub", "devA"])] }));
    await waitFor(() => l.acks.length === 2, "acks despite the drops");
    expect(l.acks.map((a) => a.upto)).toEqual([5, 9]);
    expect(hubM.channelLog("secret.x")).toBeUndefined();
    expect(hubM.channelLog("t.loop")).toBeUndefined();
    await audit.flush();
    const text = readFileSync(join(dir, "audit.log"), "utf8");
    expect(text).toMatch(/"event":"policy_violation","peer":"devA","channel":"secret.x"/);
    expect(text).toMatch(/"event":"loop_dropped","peer":"devA","channel":"t.loop"/);
    l.session.close("bye", "test");
  });

  test("a forwarder does not send a record whose route already holds the peer", async () => {
    const looped = encodeEnvelope({ id: "came-from-hub", ts: Date.now(), channel: "t.back", origin: "devB", type: "n", route: ["devB", "hub", "devA"], payload: 1 });
    await devM.ingest("t.back", [looped]);
    await devM.publish("t.back", "n", 2);
    const l = await link(["t.back"]);
    await waitFor(async () => (await hubMessages("t.back")).length === 1, "only the local one");
    expect((await hubMessages("t.back"))[0]!.payload).toBe(2);
    await waitFor(() => l.fwd.loopSkipped === 1, "loop skip counted");
    l.session.close("bye", "test");
  });
});

/** The one frame in `bytes`. */
const decodeOne = (bytes: Uint8Array) => new FrameDecoder(1 << 20).push(bytes)[0]!;

describe("forwarder writes", () => {
  test("a lone record goes to the session to be written in the call; records read together, and every batch after the first of a turn, share the end of the turn", async () => {
    const dir2 = tmpDir();
    const m = await Messenger.open({ name: "devX", storage: { dataDir: dir2 } });
    const sent: { records: number; now: boolean }[] = [];
    // Turns of the event loop, counted by an immediate that schedules itself.
    let turn = 0;
    let counting = true;
    const count = () => {
      turn++;
      if (counting) setImmediate(count);
    };
    setImmediate(count);
    const turns: number[] = [];
    const session: Link = {
      peer: { name: "hub" },
      state: "open",
      send: (b: Uint8Array, now?: boolean) => {
        turns.push(turn);
        return sent.push({ records: parseBatch(decodeOne(b)).records.length, now: now === true }) > 0;
      },
      writable: async () => {},
      pack: (f: Uint8Array) => f,
      close: () => {},
    };
    const fwd = new Forwarder({ messenger: m, session, patterns: ["t.>"], start: "earliest", window: 64, maxBatchBytes: 64 * 1024, logger: silentLogger });
    void fwd.run();
    await m.publish("t.a", "n", 1);
    await waitFor(() => sent.length === 1, "the lone record's batch");
    expect(sent[0]).toEqual({ records: 1, now: true });
    // Two records of one channel in one commit: one batch of two, at the end of the turn.
    await m.publishBatch([
      { channel: "t.a", type: "n", payload: 2 },
      { channel: "t.a", type: "n", payload: 3 },
    ]);
    await waitFor(() => sent.length === 2, "the batch of two");
    expect(sent[1]).toEqual({ records: 2, now: false });
    // One record on each of four channels in one commit: a batch each, the first on its own, and
    // never two written on their own in one turn.
    await m.publishBatch(["t.b", "t.c", "t.d", "t.e"].map((channel, i) => ({ channel, type: "n", payload: 4 + i })));
    await waitFor(() => sent.length === 6, "a batch per channel");
    expect(sent.slice(2).map((x) => x.records)).toEqual([1, 1, 1, 1]);
    expect(sent[2]!.now).toBe(true);
    const onTheirOwn = new Map<number, number>();
    for (const [i, x] of sent.entries()) if (x.now) onTheirOwn.set(turns[i]!, (onTheirOwn.get(turns[i]!) ?? 0) + 1);
    expect(Math.max(...onTheirOwn.values())).toBe(1);
    expect(sent.slice(2).some((x) => !x.now)).toBe(true);
    counting = false;
    fwd.stop();
    await m.close();
  });
});

describe("forwarder cursor", () => {
  test("records skipped while an earlier batch is unacknowledged do not move the cursor past that batch", async () => {
    const dir2 = tmpDir();
    const m = await Messenger.open({ name: "devX", storage: { dataDir: dir2 } });
    const sent: Uint8Array[] = [];
    // A session that records frames and never acks: the batch stays in flight.
    const session: Link = { peer: { name: "hub" }, state: "open", send: (b: Uint8Array) => sent.push(b) > 0, writable: async () => {}, pack: (f: Uint8Array) => f, close: () => {} };
    const fwd = new Forwarder({ messenger: m, session, patterns: ["t.c"], start: "earliest", window: 8, maxBatchBytes: 64 * 1024, logger: silentLogger });
    await m.publish("t.c", "n", 1);
    void fwd.run();
    await waitFor(() => sent.length === 1, "first batch sent");
    // Now only records that already went through the hub: nothing to send for them.
    await m.ingest("t.c", [encodeEnvelope({ id: "x1", ts: Date.now(), channel: "t.c", origin: "o", type: "n", route: ["o", "hub"], payload: 2 })]);
    await waitFor(() => fwd.loopSkipped === 1, "looped record skipped");
    const cursor = () => m.openSubscriber("t.c", cursorName("hub"), { create: false }).positions().get("t.c");
    expect(cursor()).toBe(1); // still before the unacknowledged batch
    fwd.onAck({ batch: 1, channel: "t.c", upto: 1 });
    expect(cursor()).toBe(3); // the ack of batch 1 covers the skipped record too
    fwd.stop();
    await m.close();
  });
});
