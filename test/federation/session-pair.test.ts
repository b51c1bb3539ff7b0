/**
 * PeerSession over an in-memory pipe: the handshake, refusals, heartbeats,
 * round trips, malformed bytes and write backpressure, without TLS (the
 * mTLS tests in session.test.ts keep the real transport covered).
 */
import { describe, expect, test } from "bun:test";
import { FrameDecoder, FrameType } from "../../src/federation/frame.ts";
import { ackFrame, batchFrame, clientHello, type Welcome } from "../../src/federation/messages.ts";
import type { PeerSession, SessionEvents } from "../../src/federation/session.ts";
import { waitFor } from "../helpers.ts";
import { sessionPair } from "./memory-pair.ts";

const hello = (heartbeatMs = 5_000) => clientHello({ name: "dev", mode: "link", publish: ["up.>"], subscribe: ["down.>"], heartbeatMs, maxBatchBytes: 65_536 });
const welcome = (heartbeatMs = 5_000): Welcome => ({ version: 1, name: "hub", publish: ["up.>"], subscribe: ["down.>"], heartbeatMs, maxBatchBytes: 65_536 });

/** Events that record what a session heard. */
function recorder(extra: SessionEvents = {}) {
  const seen = { opened: 0, closed: [] as string[], batches: [] as number[], acks: [] as number[] };
  const events: SessionEvents = {
    onOpen: () => void seen.opened++,
    onClose: (_s, reason) => void seen.closed.push(reason),
    onBatch: (_s, b) => void seen.batches.push(b.batch),
    onAck: (_s, a) => void seen.acks.push(a.batch),
    ...extra,
  };
  return { seen, events };
}

describe("PeerSession over an in-memory pipe", () => {
  test("HELLO, WELCOME, both open; a batch up and its ack down; the hub's heartbeat applies to both", async () => {
    const c = recorder();
    const h = recorder({ onHello: () => welcome(1_234) });
    const { client, hub } = sessionPair(c.events, h.events);
    client.sendHello(hello());
    await waitFor(() => c.seen.opened === 1 && h.seen.opened === 1, "both open");
    expect([client.state, hub.state]).toEqual(["open", "open"]);
    expect(hub.hello).toMatchObject({ name: "dev", mode: "link", publish: ["up.>"] });
    expect(client.welcome).toEqual(welcome(1_234));
    client.send(batchFrame({ batch: 7, channel: "up.x", seqs: [1], records: [new Uint8Array([0x80])] }));
    await waitFor(() => h.seen.batches.length === 1, "batch at the hub");
    hub.send(ackFrame({ batch: 7, channel: "up.x", upto: 1 }));
    await waitFor(() => c.seen.acks.length === 1, "ack at the client");
    expect([h.seen.batches, c.seen.acks]).toEqual([[7], [7]]);
    client.close("shutdown", "done");
    await waitFor(() => h.seen.closed.length === 1, "hub sees the close");
    expect(h.seen.closed[0]).toBe("peer closed: shutdown: done");
    expect(c.seen.closed).toEqual(["shutdown: done"]);
  });

  test("a refusal and a version nobody speaks close the session with the reason, at both ends", async () => {
    const c = recorder();
    const h = recorder({ onHello: () => ({ refuse: "not in hub.peers", code: "unknown_peer" }) });
    const { client } = sessionPair(c.events, h.events);
    client.sendHello(hello());
    await waitFor(() => c.seen.closed.length === 1, "client closed");
    expect(client.peerClose).toEqual({ code: "unknown_peer", reason: "not in hub.peers" });
    expect(c.seen.opened + h.seen.opened).toBe(0);

    const c2 = recorder();
    const h2 = recorder({ onHello: () => welcome() });
    const two = sessionPair(c2.events, h2.events);
    two.client.sendHello({ ...hello(), versions: [99] });
    await waitFor(() => c2.seen.closed.length === 1, "client closed");
    expect(two.client.peerClose?.code).toBe("version");
  });

  test("no HELLO within the handshake time: the hub closes", async () => {
    const h = recorder({ onHello: () => welcome() });
    const { hub } = sessionPair(recorder().events, h.events, { handshakeTimeoutMs: 100 });
    await waitFor(() => h.seen.closed.length === 1, "hub closed", 2_000);
    // (The client's own handshake timer may fire first: then the hub hears it from the client.)
    expect(h.seen.closed[0]).toMatch(/^(peer closed: )?handshake_timeout: no handshake within the time limit$/);
    expect(hub.state).toBe("closed");
  });

  test("an idle healthy session stays up: the dialer pings, the hub only answers and learns the round trip from the pings; a path gone silent is closed within three heartbeats", async () => {
    const c = recorder();
    const h = recorder({ onHello: () => welcome(150) });
    const { client, hub, clientEnd, hubEnd } = sessionPair(c.events, h.events, { heartbeatMs: 150 });
    const pings = { client: 0, hub: 0 };
    for (const [side, end] of [
      ["client", clientEnd],
      ["hub", hubEnd],
    ] as const) {
      const decoder = new FrameDecoder(1 << 20);
      const write = end.write;
      end.write = (bytes) => {
        for (const f of decoder.push(bytes.slice())) if (f.type === FrameType.PING) pings[side]++;
        return write.call(end, bytes);
      };
    }
    client.sendHello(hello(150));
    await waitFor(() => client.state === "open", "open");
    // The hub's from the round trip the client measured and sent with its next ping.
    await waitFor(() => client.rttMs !== undefined && hub.rttMs !== undefined, "the round trip known at both ends", 2_000);
    const quietSince = Date.now();
    await waitFor(() => Date.now() - quietSince > 600, "four idle heartbeats");
    expect([client.state, hub.state]).toEqual(["open", "open"]);
    expect(pings.client).toBeGreaterThanOrEqual(4);
    expect(pings.hub).toBe(0);
    // The path now drops everything both ways, without a FIN.
    clientEnd.silent = true;
    hubEnd.silent = true;
    const cut = Date.now();
    await waitFor(() => c.seen.closed.length === 1 && h.seen.closed.length === 1, "both closed", 3_000);
    expect(c.seen.closed[0]).toStartWith("heartbeat: no frame from hub");
    expect(h.seen.closed[0]).toStartWith("heartbeat: no frame from dev");
    expect(Date.now() - cut).toBeLessThan(3 * 150 + 500);
  });

  test("bytes that are not frames close the session as malformed; the other side hears why", async () => {
    const c = recorder();
    const h = recorder({ onHello: () => welcome() });
    const { client, hub } = sessionPair(c.events, h.events);
    client.sendHello(hello());
    await waitFor(() => hub.state === "open", "open");
    hub.receive(new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8, 9]));
    await waitFor(() => c.seen.closed.length === 1, "client hears the close");
    expect(h.seen.closed[0]).toStartWith("malformed_frame");
    expect(client.peerClose?.code).toBe("malformed_frame");
  });

  test("what the transport does not take waits for its drain, and arrives whole and in order", async () => {
    const c = recorder();
    const got: number[] = [];
    const h = recorder({ onHello: () => welcome(), onBatch: (_s: PeerSession, b) => void got.push(b.batch) });
    const { client, clientEnd } = sessionPair(c.events, h.events);
    client.sendHello(hello());
    await waitFor(() => client.state === "open", "open");
    clientEnd.capacity = 100;
    for (let i = 1; i <= 20; i++) client.send(batchFrame({ batch: i, channel: "up.x", seqs: [i], records: [new Uint8Array(50).fill(0x80)] }));
    await waitFor(() => clientEnd.written > 0, "a first write");
    while (got.length < 20) {
      clientEnd.drain();
      await new Promise<void>((r) => setImmediate(r));
    }
    expect(got).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
  });
});
