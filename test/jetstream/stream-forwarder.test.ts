import { describe, expect, test } from "bun:test";
import { compilePattern } from "../../src/envelope/names.ts";
import { decodeEnvelope, encodeEnvelope } from "../../src/envelope/envelope.ts";
import { AuditLog } from "../../src/federation/audit.ts";
import { FrameDecoder, FrameType } from "../../src/federation/frame.ts";
import type { Link } from "../../src/federation/link.ts";
import { parseBatch, type Batch } from "../../src/federation/messages.ts";
import { DEFAULT_REQUEST_TTL_MS, downRecord, streamMessageId, type StreamMessage } from "../../src/jetstream/foreign.ts";
import { inboxReplySubject, replySubjectInbox } from "../../src/jetstream/subjects.ts";
import { MemoryPositions, positionKey } from "../../src/jetstream/positions.ts";
import { planStreams, StreamForwarder, type StreamSource } from "../../src/jetstream/stream-forwarder.ts";
import { subjectChannel } from "../../src/jetstream/subjects.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { tmpDir, waitFor } from "../helpers.ts";
import { join } from "node:path";
import { readFileSync } from "node:fs";

/** A stream in memory: sequences from `first`, appended by the test, read like an ordered consumer. */
class MemoryStream implements StreamSource {
  readonly msgs: StreamMessage[] = [];
  first = 1;
  private wake: (() => void)[] = [];

  append(channel: string, body: Uint8Array, headers: Record<string, string> = {}): number {
    const seq = this.first + this.msgs.length;
    this.msgs.push({ subject: `kp.${channel}`, data: body, seq, timestampMs: 1_700_000_000_000 + seq, header: (n) => headers[n] });
    for (const w of this.wake.splice(0)) w();
    return seq;
  }

  async bounds(): Promise<{ first: number; last: number }> {
    return { first: this.first, last: this.first + this.msgs.length - 1 };
  }

  async *read(_stream: string, from: number, filter: string | undefined, signal: AbortSignal): AsyncIterable<StreamMessage> {
    const match = filter ? compilePattern(filter.slice("kp.".length)) : () => true;
    let i = Math.max(0, from - this.first);
    while (!signal.aborted) {
      while (i < this.msgs.length) {
        const m = this.msgs[i++]!;
        if (match(subjectChannel("kp", m.subject) ?? "")) yield m;
      }
      await new Promise<void>((res) => {
        this.wake.push(res);
        signal.addEventListener("abort", () => res(), { once: true });
      });
    }
  }
}

function envelope(channel: string, n: number, route = ["origin"]): Uint8Array {
  return encodeEnvelope({ id: Bun.randomUUIDv7(), ts: Date.now(), channel, origin: route[0]!, type: "n", route, payload: n });
}

function fakeLink(peer: string): Link & { batches: Batch[] } {
  const decoder = new FrameDecoder(4 << 20);
  const batches: Batch[] = [];
  return {
    batches,
    peer: { name: peer },
    state: "open",
    send(bytes) {
      for (const f of decoder.push(bytes)) if (f.type === FrameType.BATCH) batches.push(parseBatch(f));
      return true;
    },
    writable: async () => {},
    pack: (f) => f,
    close() {},
  };
}

function forwarder(
  source: StreamSource,
  positions: MemoryPositions | null,
  link: Link,
  o: { patterns?: string[]; start?: "earliest" | "latest"; window?: number; audit?: AuditLog; allow?: (c: string) => boolean; onRequest?: (inbox: string, expires: number) => void } = {},
) {
  return new StreamForwarder({
    source,
    positions,
    session: link,
    tier: "hub",
    plans: planStreams([{ name: "CMD", channels: ["cmd.>"] }], o.patterns ?? ["cmd.board.>"], "kp"),
    allow: o.allow ?? (() => true),
    start: o.start ?? "earliest",
    prefix: "kp",
    window: o.window ?? 4,
    maxBatchBytes: 64 * 1024,
    maxMessageBytes: 1 << 20,
    logger: silentLogger,
    audit: o.audit,
    onRequest: o.onRequest,
  });
}

const key = positionKey("hub", "board", "CMD");

describe("planStreams", () => {
  const streams = [
    { name: "TELEMETRY", channels: ["telemetry.>"] },
    { name: "CMD", channels: ["cmd.>"] },
  ];
  test("one pattern in a stream is read with its own subject as the filter", () => {
    expect(planStreams(streams, ["cmd.board-7.>"], "kp")).toEqual([{ stream: "CMD", patterns: ["cmd.board-7.>"], subject: "kp.cmd.board-7.>" }]);
  });
  test("a wide pattern meets each stream's channels; several in one stream are read unfiltered and matched here", () => {
    expect(planStreams(streams, [">"], "kp")).toEqual([
      { stream: "TELEMETRY", patterns: ["telemetry.>"], subject: "kp.telemetry.>" },
      { stream: "CMD", patterns: ["cmd.>"], subject: "kp.cmd.>" },
    ]);
    expect(planStreams(streams, ["cmd.a.>", "cmd.b.>", "logs.>"], "kp")).toEqual([{ stream: "CMD", patterns: ["cmd.a.>", "cmd.b.>"], subject: undefined }]);
  });
});

describe("StreamForwarder", () => {
  test("sends the board's channels in stream order, one batch per run of a channel, and moves the position over the acknowledged prefix only", async () => {
    const s = new MemoryStream();
    s.append("cmd.other.x", envelope("cmd.other.x", 0));
    for (let i = 0; i < 3; i++) s.append("cmd.board.a", envelope("cmd.board.a", i));
    s.append("cmd.board.b", envelope("cmd.board.b", 3));
    const pos = new MemoryPositions();
    const link = fakeLink("board");
    const f = forwarder(s, pos, link);
    const running = f.run();
    await waitFor(() => link.batches.length === 2, "two batches");
    expect(link.batches.map((b) => [b.channel, b.seqs])).toEqual([
      ["cmd.board.a", [2, 3, 4]],
      ["cmd.board.b", [5]],
    ]);
    expect(link.batches[0]!.records.map((r) => decodeEnvelope(r, 0).payload)).toEqual([0, 1, 2]);
    // Nothing acknowledged yet: the position is where the board started (before the first message).
    expect(pos.values.get(key)).toBe(0);
    f.onAck({ batch: link.batches[1]!.batch, channel: "cmd.board.b", upto: 5 });
    expect(pos.values.get(key)).toBe(0);
    f.onAck({ batch: link.batches[0]!.batch, channel: "cmd.board.a", upto: 4 });
    expect(pos.values.get(key)).toBe(5);
    f.stop();
    await running;
  });

  test("never more batches unacknowledged than the window; each ACK lets one more go", async () => {
    const s = new MemoryStream();
    const link = fakeLink("board");
    const f = forwarder(s, new MemoryPositions(), link, { window: 2 });
    const running = f.run();
    // One message at a time so that each is its own batch.
    s.append("cmd.board.a", envelope("cmd.board.a", 0));
    await waitFor(() => link.batches.length === 1, "first");
    s.append("cmd.board.b", envelope("cmd.board.b", 1));
    await waitFor(() => link.batches.length === 2, "second");
    s.append("cmd.board.a", envelope("cmd.board.a", 2));
    s.append("cmd.board.b", envelope("cmd.board.b", 3));
    await Bun.sleep(50);
    expect(link.batches.length).toBe(2);
    expect(f.unacked).toBe(2);
    f.onAck({ batch: link.batches[0]!.batch, channel: link.batches[0]!.channel, upto: link.batches[0]!.seqs.at(-1)! });
    await waitFor(() => link.batches.length === 3, "one more after the ack");
    expect(f.unacked).toBe(2);
    f.stop();
    await running;
  });

  test("a board comes back after its stored position; a new board starts at the end with start: latest", async () => {
    const s = new MemoryStream();
    for (let i = 0; i < 5; i++) s.append("cmd.board.a", envelope("cmd.board.a", i));
    const pos = new MemoryPositions();
    pos.put(key, 3);
    const link = fakeLink("board");
    const f = forwarder(s, pos, link);
    const running = f.run();
    await waitFor(() => link.batches.length === 1, "the rest");
    expect(link.batches[0]!.seqs).toEqual([4, 5]);
    f.stop();
    await running;

    const fresh = new MemoryPositions();
    const link2 = fakeLink("board");
    const g = forwarder(s, fresh, link2, { start: "latest" });
    const running2 = g.run();
    await waitFor(() => fresh.values.get(key) === 5, "a new board's position is stored at once");
    s.append("cmd.board.a", envelope("cmd.board.a", 5));
    await waitFor(() => link2.batches.length === 1, "only what came after");
    expect(link2.batches[0]!.seqs).toEqual([6]);
    g.stop();
    await running2;
  });

  test("a position older than the stream's first message: the gap is counted, audited, and reading starts at the first", async () => {
    const dir = tmpDir();
    const audit = new AuditLog({ path: join(dir, "audit.log"), maxFileBytes: 1 << 20, maxFiles: 2, logger: silentLogger });
    const s = new MemoryStream();
    s.first = 101;
    s.append("cmd.board.a", envelope("cmd.board.a", 0));
    const pos = new MemoryPositions();
    pos.put(key, 40);
    const link = fakeLink("board");
    const f = forwarder(s, pos, link, { audit });
    const running = f.run();
    await waitFor(() => link.batches.length === 1, "the first message there is");
    expect(link.batches[0]!.seqs).toEqual([101]);
    expect(f.stats.expired).toBe(60);
    await audit.flush();
    const line = JSON.parse(readFileSync(join(dir, "audit.log"), "utf8").trim().split("\n").at(-1)!);
    expect(line).toMatchObject({ event: "position_expired", peer: "board", stream: "CMD", position: 40, first: 101, skipped: 60 });
    f.stop();
    await running;
    audit.close();
  });

  test("what came from the board itself, or lies outside its rules, is not sent, and the position still moves past it", async () => {
    const s = new MemoryStream();
    s.append("cmd.board.a", envelope("cmd.board.a", 0, ["board", "hub"]));
    s.append("cmd.board.secret", envelope("cmd.board.secret", 1));
    const pos = new MemoryPositions();
    const link = fakeLink("board");
    const f = forwarder(s, pos, link, { allow: (c) => c !== "cmd.board.secret" });
    const running = f.run();
    await waitFor(() => pos.values.get(key) === 2, "position past both");
    expect(link.batches).toEqual([]);
    expect(f.stats).toMatchObject({ loopSkipped: 1, passed: 1 });
    f.stop();
    await running;
  });

  test("a NATS client's request is sent with its inbox noted; an expired one is not sent", async () => {
    const s = new MemoryStream();
    const now = Date.now();
    // Stored by a NATS client: headers for the reply subject and the time to live.
    const ask = (ttl: string) => ({ "Keyop-Reply-To": "_INBOX.abc.1", "Keyop-Ttl-Ms": ttl });
    s.msgs.push({ subject: "kp.cmd.board.old", data: new TextEncoder().encode("{}"), seq: 1, timestampMs: now - 60_000, header: (n) => ask("1000")[n as keyof ReturnType<typeof ask>] });
    s.msgs.push({ subject: "kp.cmd.board.ask", data: new TextEncoder().encode('{"n":1}'), seq: 2, timestampMs: now, header: (n) => ask("5000")[n as keyof ReturnType<typeof ask>] });
    const noted: [string, number][] = [];
    const link = fakeLink("board");
    const f = forwarder(s, new MemoryPositions(), link, { onRequest: (inbox, expires) => noted.push([inbox, expires]) });
    const running = f.run();
    await waitFor(() => link.batches.length === 1, "the live request");
    expect(link.batches[0]!.channel).toBe("cmd.board.ask");
    const e = decodeEnvelope(link.batches[0]!.records[0]!, 0);
    expect(e.replyTo).toBe(replySubjectInbox("_INBOX.abc.1"));
    expect(e.expires).toBe(now + 5000);
    expect(noted).toEqual([[replySubjectInbox("_INBOX.abc.1"), now + 5000]]);
    f.stop();
    await running;
  });

  test("an ephemeral peer reads from the end and keeps no position", async () => {
    const s = new MemoryStream();
    s.append("cmd.board.a", envelope("cmd.board.a", 0));
    const link = fakeLink("board");
    const f = forwarder(s, null, link, { start: "earliest" });
    const running = f.run();
    await Bun.sleep(20);
    s.append("cmd.board.a", envelope("cmd.board.a", 1));
    await waitFor(() => link.batches.length === 1, "the live one");
    expect(link.batches[0]!.seqs).toEqual([2]);
    f.stop();
    await running;
  });
});

describe("downRecord", () => {
  test("a keyop envelope goes down as it is stored", () => {
    const body = envelope("cmd.board.a", 7);
    const r = downRecord({ subject: "kp.cmd.board.a", data: body, seq: 9, timestampMs: 1, header: () => undefined }, { prefix: "kp", stream: "CMD", tier: "hub", maxBytes: 1 << 20 });
    expect(r).toEqual({ channel: "cmd.board.a", id: decodeEnvelope(body, 0).id, body });
  });

  test("a plain NATS message is wrapped: JSON payload, headers for type, origin and correlation, an id the same on every hub", () => {
    const m: StreamMessage = {
      subject: "kp.cmd.board.reboot",
      data: new TextEncoder().encode('{"delay_s":5}'),
      seq: 42,
      timestampMs: 1_700_000_000_123,
      header: (n) => ({ "Keyop-Type": "reboot", "Keyop-Origin": "ops", "Keyop-Correlation-Id": "c-1" })[n],
    };
    const a = downRecord(m, { prefix: "kp", stream: "CMD", tier: "hub", maxBytes: 1 << 20 });
    const b = downRecord(m, { prefix: "kp", stream: "CMD", tier: "hub", maxBytes: 1 << 20 });
    if ("skip" in a || "skip" in b) throw new Error("expected records");
    expect(a.id).toBe(b.id);
    expect(a.id).toBe(streamMessageId("CMD", 42, 1_700_000_000_123));
    expect(a.id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    // The time part is the stream's timestamp, as in keyop's own UUIDv7 ids.
    expect(Number.parseInt(a.id.replaceAll("-", "").slice(0, 12), 16)).toBe(1_700_000_000_123);
    const e = decodeEnvelope(a.body, 0);
    expect(e).toMatchObject({ channel: "cmd.board.reboot", type: "reboot", origin: "ops", correlationId: "c-1", route: ["hub"], payload: { delay_s: 5 }, ts: 1_700_000_000_123 });
    expect(streamMessageId("CMD", 43, 1_700_000_000_123)).not.toBe(a.id);
    const bytes = downRecord({ ...m, data: new Uint8Array([0xff, 0x00]), header: () => undefined }, { prefix: "kp", stream: "CMD", tier: "hub", maxBytes: 1 << 20 });
    if ("skip" in bytes) throw new Error("expected a record");
    expect(decodeEnvelope(bytes.body, 0)).toMatchObject({ type: "nats", origin: "nats" });
    expect(new Uint8Array(decodeEnvelope(bytes.body, 0).payload as Uint8Array)).toEqual(new Uint8Array([0xff, 0x00]));
  });

  test("a request from a NATS client: Keyop-Reply-To becomes an inbox that names the subject, Keyop-Ttl-Ms its expiry (30 s by default)", () => {
    const o = { prefix: "kp", stream: "CMD", tier: "hub", maxBytes: 1 << 20 };
    const m = (h: Record<string, string>): StreamMessage => ({ subject: "kp.cmd.board.x", data: new TextEncoder().encode("{}"), seq: 1, timestampMs: 1000, header: (n) => h[n] });
    const r = downRecord(m({ "Keyop-Reply-To": "_INBOX.Ab-9.7" }), o);
    if ("skip" in r) throw new Error(r.skip);
    const e = decodeEnvelope(r.body, 0);
    expect(inboxReplySubject(e.replyTo!)).toBe("_INBOX.Ab-9.7");
    expect(e.expires).toBe(1000 + DEFAULT_REQUEST_TTL_MS);
    const t = downRecord(m({ "Keyop-Ttl-Ms": "250" }), o);
    if ("skip" in t) throw new Error(t.skip);
    expect(decodeEnvelope(t.body, 0)).toMatchObject({ expires: 1250 });
    expect(decodeEnvelope(t.body, 0).replyTo).toBeUndefined();
    expect(downRecord(m({ "Keyop-Ttl-Ms": "soon" }), o)).toMatchObject({ skip: expect.stringContaining("Keyop-Ttl-Ms") });
    expect(downRecord(m({ "Keyop-Reply-To": "bad subject" }), o)).toMatchObject({ skip: expect.stringContaining("Keyop-Reply-To") });
    expect(downRecord(m({ "Keyop-Reply-To": "a.>" }), o)).toMatchObject({ skip: expect.stringContaining("Keyop-Reply-To") });
  });

  test("a subject that is not a channel, or a message too large, is passed over with the reason", () => {
    const o = { prefix: "kp", stream: "CMD", tier: "hub", maxBytes: 100 };
    expect(downRecord({ subject: "other.x", data: new Uint8Array(1), seq: 1, timestampMs: 1, header: () => undefined }, o)).toMatchObject({ skip: expect.stringContaining("not a keyop channel") });
    expect(downRecord({ subject: "kp.cmd.x", data: new Uint8Array(500).fill(0x61), seq: 1, timestampMs: 1, header: () => undefined }, o)).toMatchObject({ skip: expect.stringContaining("exceeds") });
  });
});
