/**
 * The shared consumer cases (consumer-cases.ts) against each adapter of the
 * cursor reader: the HTTP stream, the federation forwarder (over a link that
 * records its frames) and an MQTT subscription (a raw client of a real
 * listener, acknowledging by hand).
 */
import mqtt, { type Packet } from "mqtt-packet";
import { StreamSession } from "../../src/api/stream.ts";
import { Forwarder, cursorName } from "../../src/federation/forwarder.ts";
import type { Link } from "../../src/federation/link.ts";
import { FrameDecoder, FrameType } from "../../src/federation/frame.ts";
import { parseBatch } from "../../src/federation/messages.ts";
import { Messenger } from "../../src/messenger/messenger.ts";
import { sessionName } from "../../src/mqtt/session.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { startTestAgent, tmpDir, waitFor } from "../helpers.ts";
import { type Consumer, type ConsumerHarness, describeConsumer, type Seen, WINDOW } from "./consumer-cases.ts";

/** A harness over a messenger of its own: publish and cursor go straight to it. */
function overMessenger(m: Messenger, name: string, acks: ConsumerHarness["acks"], start: ConsumerHarness["start"], subscriberName = (n: string) => n): ConsumerHarness {
  return {
    name,
    acks,
    start,
    publish: async (channel) => {
      const seq = m.channelLog(channel)?.nextSeq ?? 1;
      // The payload names the seq, for clients that are not told it (MQTT).
      const r = await m.publish(channel, "t", String(seq));
      if (r.seq !== seq) throw new Error(`expected seq ${seq}, got ${r.seq}`);
      return r.seq;
    },
    cursor: (pattern, n, channel) => m.openSubscriber(pattern, subscriberName(n), { create: false }).cursorOf(channel),
    close: () => m.close(),
  };
}

describeConsumer("HTTP stream", async () => {
  const m = await Messenger.open({ storage: { dataDir: tmpDir() }, logger: silentLogger });
  return overMessenger(m, "stream", "cumulative", async (pattern, name) => {
    const s = new StreamSession(m.openSubscriber(pattern, name, { from: "earliest" }), { maxInflight: WINDOW, autoAck: false });
    const received: Seen[] = [];
    const pump = (async () => {
      for (;;) {
        const msgs = await s.next(50);
        if (msgs === null) return;
        for (const x of msgs) received.push({ channel: x.channel, seqs: [x.seq] });
      }
    })();
    return {
      received,
      ack: (d) => void s.ack(d.seqs.at(-1), d.channel),
      stop: async () => {
        s.close();
        await pump;
      },
    } satisfies Consumer;
  });
});

describeConsumer("federation forwarder", async () => {
  const m = await Messenger.open({ storage: { dataDir: tmpDir() }, logger: silentLogger });
  return overMessenger(
    m,
    "forwarder",
    "each",
    async (pattern, peer) => {
      const received: (Seen & { batch: number })[] = [];
      const decoder = new FrameDecoder(4 << 20);
      const link: Link = {
        peer: { name: peer },
        state: "open",
        send: (bytes) => {
          for (const f of decoder.push(bytes)) {
            if (f.type !== FrameType.BATCH) continue;
            const b = parseBatch(f);
            received.push({ channel: b.channel, seqs: b.seqs, batch: b.batch });
          }
          return true;
        },
        writable: async () => {},
        pack: (f) => f,
        close: () => {},
      };
      const fwd = new Forwarder({ messenger: m, session: link, patterns: [pattern], start: "earliest", window: WINDOW, maxBatchBytes: 64 * 1024, logger: silentLogger });
      const running = fwd.run();
      return {
        received,
        ack: (d) => fwd.onAck({ batch: (d as Seen & { batch: number }).batch, channel: d.channel, upto: d.seqs.at(-1)! }),
        stop: async () => {
          fwd.stop();
          await running;
        },
      } satisfies Consumer;
    },
    cursorName,
  );
});

describeConsumer("MQTT subscription", async () => {
  const t = await startTestAgent({ mqtt: { listen: "127.0.0.1:0", max_inflight: WINDOW } });
  const port = t.agent.mqtt!.port!;
  const m = t.agent.messenger;
  const h = overMessenger(
    m,
    "mqtt",
    "each",
    async (pattern, clientId) => {
      const received: (Seen & { id: number })[] = [];
      const parser = mqtt.parser({ protocolVersion: 4 });
      let subacked = false;
      parser.on("packet", (p: Packet) => {
        if (p.cmd === "suback") subacked = true;
        if (p.cmd === "publish" && p.qos === 1) {
          const seq = Number(Buffer.from(p.payload).toString());
          received.push({ channel: p.topic.replaceAll("/", "."), seqs: [seq], id: p.messageId! });
        }
      });
      let connacked = false;
      parser.on("packet", (p: Packet) => {
        if (p.cmd === "connack") connacked = true;
      });
      const sock = await Bun.connect({
        hostname: "127.0.0.1",
        port,
        socket: {
          data: (_s, d) => void parser.parse(Buffer.from(d)),
        },
      });
      const send = (p: Packet) => void sock.write(mqtt.generate(p));
      // A persistent session: what is not acknowledged comes again on the next connection.
      send({ cmd: "connect", protocolId: "MQTT", protocolVersion: 4, clean: false, clientId, keepalive: 0 } as Packet);
      await waitFor(() => connacked, "CONNACK");
      send({ cmd: "subscribe", messageId: 1, subscriptions: [{ topic: pattern.replaceAll(".", "/").replace(/>$/, "#"), qos: 1 }] } as Packet);
      await waitFor(() => subacked, "SUBACK");
      return {
        received,
        ack: (d) => send({ cmd: "puback", messageId: (d as Seen & { id: number }).id } as Packet),
        stop: async () => {
          send({ cmd: "disconnect" } as Packet);
          sock.end();
          await waitFor(() => t.agent.mqtt!.count() === 0, "the session let go");
        },
      } satisfies Consumer;
    },
    sessionName,
  );
  return { ...h, close: () => t.stop() };
});
