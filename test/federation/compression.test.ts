/**
 * Batch compression: the codec agreed in HELLO/WELCOME, batches that stay
 * plain, and COMPRESSED frames a receiver refuses.
 */
import { describe, expect, test } from "bun:test";
import { deflateRawSync } from "node:zlib";
import { chooseCodec, codecsFor, compressFrame, decompressFrame, MIN_COMPRESS_BYTES } from "../../src/federation/compression.ts";
import { encodeFrame, FrameDecoder, FrameError, FrameType } from "../../src/federation/frame.ts";
import { batchFrame, clientHello, parseBatch, welcomeFrame, type Batch, type Welcome } from "../../src/federation/messages.ts";
import { PeerSession } from "../../src/federation/session.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import type { Codec } from "../../src/federation/compression.ts";
import { waitFor } from "../helpers.ts";
import { sessionPair } from "./memory-pair.ts";

const json = (i: number) => new TextEncoder().encode(JSON.stringify({ device: "board-17", sensor: "temp", seq: i, celsius: 20 + (i % 7) / 10, ts: 1_795_940_853_240 + i }));
const telemetry = (n: number): Batch => ({ batch: 1, channel: "t.x", seqs: Array.from({ length: n }, (_, i) => i + 1), records: Array.from({ length: n }, (_, i) => json(i)) });
const welcome: Welcome = { version: 1, name: "hub", publish: ["t.>"], subscribe: [], heartbeatMs: 5_000, maxBatchBytes: 1 << 20 };

function pair(client: Codec[], hub: Codec[]) {
  const got: Batch[] = [];
  const closed: string[] = [];
  const p = sessionPair(
    { onClose: (_s, r) => void closed.push(r) },
    { onHello: () => welcome, onBatch: (_s, b) => void got.push(b), onClose: (_s, r) => void closed.push(r) },
    {},
    { client: { compression: client }, hub: { compression: hub } },
  );
  p.client.sendHello(clientHello({ name: "dev", mode: "link", publish: ["t.>"], subscribe: [], heartbeatMs: 5_000, maxBatchBytes: 1 << 20, compression: client }));
  return { ...p, got, closed };
}

describe("codecs", () => {
  test("what each setting offers, and the hub's pick", () => {
    expect(codecsFor("auto")).toEqual(["zstd", "deflate"]);
    expect(codecsFor("deflate")).toEqual(["deflate"]);
    expect(codecsFor("none")).toEqual([]);
    expect(chooseCodec(["deflate", "zstd"], ["zstd", "deflate"])).toBe("zstd");
    expect(chooseCodec(["lz4", "deflate"], ["zstd", "deflate"])).toBe("deflate");
    expect(chooseCodec([], ["zstd"])).toBeUndefined();
  });

  test.each(["zstd", "deflate"] as const)("%s: 100 JSON readings shrink at least 3x and come back the same", (codec) => {
    const frame = batchFrame(telemetry(100));
    const wire = compressFrame(codec, frame);
    expect(wire[3]).toBe(FrameType.COMPRESSED);
    expect(wire.length * 3).toBeLessThan(frame.length);
    const [f] = new FrameDecoder(1 << 20).push(wire);
    const inner = decompressFrame(f!, codec, 1 << 20);
    expect(parseBatch(inner)).toEqual(telemetry(100));
  });

  test("small batches and batches that do not shrink go as they are", () => {
    const small = batchFrame(telemetry(1));
    expect(small.length).toBeLessThan(MIN_COMPRESS_BYTES);
    expect(compressFrame("zstd", small)).toBe(small);
    const random = batchFrame({ batch: 1, channel: "t.x", seqs: [1], records: [crypto.getRandomValues(new Uint8Array(4096))] });
    expect(compressFrame("zstd", random)).toBe(random);
  });

  test("a receiver refuses a codec not agreed, a frame that is not a BATCH, and a body that expands past its limit", () => {
    const wire = compressFrame("zstd", batchFrame(telemetry(100)));
    const [f] = new FrameDecoder(1 << 20).push(wire);
    expect(() => decompressFrame(f!, undefined, 1 << 20)).toThrow(FrameError);
    expect(() => decompressFrame(f!, "deflate", 1 << 20)).toThrow(/agreed on deflate/);
    expect(() => decompressFrame(f!, "zstd", 1000)).toThrow(/within 1000 bytes/);
    const notBatch = { type: FrameType.COMPRESSED, size: 0, body: { a: "zstd", t: FrameType.HELLO, z: Bun.zstdCompressSync(new Uint8Array([0x80])) } } as const;
    expect(() => decompressFrame(notBatch, "zstd", 1 << 20)).toThrow(/only a BATCH/);
    // A bomb: 50 MB of zeros in a few hundred bytes.
    const bomb = encodeFrame(FrameType.COMPRESSED, { a: "deflate", t: FrameType.BATCH, z: deflateRawSync(new Uint8Array(50_000_000)) });
    expect(bomb.length).toBeLessThan(100_000);
    const [b] = new FrameDecoder(1 << 20).push(bomb);
    expect(() => decompressFrame(b!, "deflate", 1 << 20)).toThrow(FrameError);
  });
});

describe("sessions", () => {
  test("both offer: the hub's first choice, batches compressed both ways, bytes counted", async () => {
    const p = pair(["deflate", "zstd"], ["zstd", "deflate"]);
    await waitFor(() => p.client.state === "open" && p.hub.state === "open", "open");
    expect(p.client.codec).toBe("zstd");
    expect(p.hub.codec).toBe("zstd");
    p.client.send(p.client.pack(batchFrame(telemetry(100))));
    await waitFor(() => p.got.length === 1, "batch at the hub");
    expect(p.got[0]).toEqual(telemetry(100));
    expect(p.client.wire.sentWire * 3).toBeLessThan(p.client.wire.sentRaw);
    expect(p.hub.wire).toMatchObject({ receivedRaw: p.client.wire.sentRaw, receivedWire: p.client.wire.sentWire });
  });

  test.each([
    ["the device offers none", [], ["zstd", "deflate"]],
    ["the hub takes none", ["zstd", "deflate"], []],
    ["nothing in common", ["deflate"], ["zstd"]],
  ] as const)("%s: plain batches", async (_what, client, hub) => {
    const p = pair([...client], [...hub]);
    await waitFor(() => p.client.state === "open" && p.hub.state === "open", "open");
    expect(p.client.codec).toBeUndefined();
    expect(p.hub.welcome!.compression).toBeUndefined();
    const frame = batchFrame(telemetry(100));
    expect(p.client.pack(frame)).toBe(frame);
    p.client.send(frame);
    await waitFor(() => p.got.length === 1, "batch at the hub");
    expect(p.client.wire.sentWire).toBe(p.client.wire.sentRaw);
  });

  test("a WELCOME that picks a codec the client did not offer closes the session", () => {
    const closed: string[] = [];
    const transport = { write: (b: Uint8Array) => b.length, end() {}, terminate() {} };
    const client = new PeerSession(
      transport,
      { name: "hub", fingerprint: "fp", notAfter: new Date(Date.now() + 86_400_000) },
      { role: "client", maxBody: 1 << 20, heartbeatMs: 5000, logger: silentLogger, compression: ["deflate"] },
      { onClose: (_s, r) => void closed.push(r) },
    );
    client.sendHello(clientHello({ name: "dev", mode: "link", publish: ["t.>"], subscribe: [], heartbeatMs: 5_000, maxBatchBytes: 1 << 20, compression: ["deflate"] }));
    client.receive(welcomeFrame({ ...welcome, compression: "zstd" }));
    expect(client.state).toBe("closed");
    expect(closed[0]).toContain("was not offered");
  });

  test("a COMPRESSED frame on a session without a codec closes it as malformed", async () => {
    const p = pair([], []);
    await waitFor(() => p.client.state === "open" && p.hub.state === "open", "open");
    p.client.send(compressFrame("zstd", batchFrame(telemetry(100))));
    await waitFor(() => p.hub.state === "closed", "hub closed the session");
    expect(p.closed.some((r) => r.includes("malformed_frame") && r.includes("agreed on no compression"))).toBe(true);
  });
});
