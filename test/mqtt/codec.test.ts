/**
 * The hand-written MQTT codec against mqtt-packet, the reference: every
 * packet it decodes must read as mqtt-packet reads it, every PUBLISH it
 * encodes must be the bytes mqtt-packet generates, and whatever it does not
 * handle it must leave to mqtt-packet (null).
 */
import { describe, expect, test } from "bun:test";
import mqtt, { type Packet } from "mqtt-packet";
import { decodeFast, encodePublish, frameBytes, LastTopic, MqttFrameError, MqttFramer, type Publish } from "../../src/mqtt/codec.ts";
import { encodePublishProperties, readPublishProperties } from "../../src/mqtt/properties.ts";

/** mqtt-packet's reading of `bytes` (one whole packet), with the protocol version set. */
function reference(bytes: Buffer, version: number): Packet {
  const parser = mqtt.parser({ protocolVersion: version });
  let got: Packet | undefined;
  parser.on("packet", (p: Packet) => (got = p));
  parser.on("error", (e: Error) => {
    throw e;
  });
  parser.parse(bytes);
  if (!got) throw new Error("mqtt-packet read no packet");
  return got;
}

/** A deterministic generator, so a failure can be run again. */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

const topics = ["a", "sensors/room-1/temp", "ü/ñ/☃", "x".repeat(300)];
const payloads = [Buffer.alloc(0), Buffer.from("21.5"), Buffer.alloc(200, 7), Buffer.alloc(20_000, 1)];

describe("MqttFramer", () => {
  const packets = [
    mqtt.generate({ cmd: "publish", topic: "a/b", payload: Buffer.from("hello"), qos: 1, messageId: 7, retain: false, dup: false } as Packet),
    mqtt.generate({ cmd: "puback", messageId: 9 } as Packet),
    mqtt.generate({ cmd: "pingreq" } as Packet),
    mqtt.generate({ cmd: "publish", topic: "big", payload: Buffer.alloc(70_000, 3), qos: 0, retain: false, dup: false } as Packet),
  ];
  const stream = Buffer.concat(packets);

  test("splits a stream into its packets however it is cut", () => {
    const r = rng(1);
    for (let round = 0; round < 50; round++) {
      const framer = new MqttFramer(1 << 20);
      const got: Buffer[] = [];
      let at = 0;
      while (at < stream.length) {
        // Cuts of 1 byte (inside a remaining length) up to several packets at once.
        const n = round === 0 ? 1 : 1 + Math.floor(r() * 40_000);
        for (const f of framer.feed(Buffer.from(stream.subarray(at, at + n)))) got.push(Buffer.from(frameBytes(f)));
        at += n;
      }
      expect(got).toEqual(packets);
    }
  });

  test("gives each packet's type, flags and body", () => {
    const [f] = new MqttFramer(1 << 20).feed(packets[0]!);
    expect(f!.type).toBe(3);
    expect(f!.flags).toBe(2); // QoS 1
    expect(f!.body.length).toBe(packets[0]!.length - 2);
  });

  test("refuses a packet above the limit as soon as its length is known", () => {
    const framer = new MqttFramer(1000);
    // Only the fixed header of a 70,000-byte packet has arrived.
    const err = (() => {
      try {
        framer.feed(packets[3]!.subarray(0, 5));
      } catch (e) {
        return e;
      }
    })() as MqttFrameError;
    expect(err).toBeInstanceOf(MqttFrameError);
    expect(err.code).toBe("malformed_frame");
    expect(err.reason).toBe(0x95);
    expect(err.message).toContain("exceeds mqtt.max_packet_bytes (1000)");
  });

  test("refuses a first byte MQTT does not allow at once, before any length: HTTP, type 0, QoS 3, wrong fixed flags", () => {
    for (const bytes of [Buffer.from("GET / HTTP/1.1\r\n"), Buffer.from([0x00]), Buffer.from([0x36]), Buffer.from([0x80]), Buffer.from([0x41])]) {
      expect(() => new MqttFramer(1 << 20).feed(bytes)).toThrow(MqttFrameError);
    }
    // SUBSCRIBE, UNSUBSCRIBE and PUBREL carry flags 2.
    for (const first of [0x82, 0xa2, 0x62]) expect(new MqttFramer(100).feed(Buffer.from([first, 0]))).toHaveLength(1);
  });

  test("refuses a remaining length of more than 4 bytes", () => {
    expect(() => new MqttFramer(1 << 30).feed(Buffer.from([0x30, 0xff, 0xff, 0xff, 0xff, 0x01]))).toThrow(MqttFrameError);
  });
});

describe("LastTopic", () => {
  test("gives the decoded topic, the same string again for the same bytes, and a new one for any other", () => {
    const last = new LastTopic();
    const at = (topic: Buffer | string) => {
      const b = Buffer.concat([Buffer.from([1, 2, 3]), Buffer.from(topic), Buffer.from([9])]);
      return last.of(b, 3, b.length - 1);
    };
    const seq = ["a/b", "a/b", "a/c", "a/b", "", "", "é/€", "é/€", "a/bc", "a/b", "x".repeat(300), "x".repeat(299) + "y"];
    for (const t of seq) expect(at(t)).toBe(t);
    // The bytes are kept as a copy: the read's buffer changing afterwards does not change the next answer.
    const b = Buffer.from("s/t");
    expect(last.of(b, 0, 3)).toBe("s/t");
    b[2] = 0x75;
    expect(last.of(b, 0, 3)).toBe("s/u");
    // Bytes that are not UTF-8 read as Buffer reads them.
    const bad = Buffer.from([0x61, 0xff, 0x62]);
    expect(last.of(bad, 0, 3)).toBe(bad.toString("utf8"));
    expect(last.of(Buffer.from([0x61, 0xfe, 0x62]), 0, 3)).toBe(Buffer.from([0x61, 0xfe, 0x62]).toString("utf8"));
  });
});

describe("decodeFast", () => {
  for (const version of [4, 5]) {
    test(`reads every PUBLISH without properties as mqtt-packet does (MQTT ${version === 5 ? "5" : "3.1.1"})`, () => {
      let n = 0;
      for (const topic of topics)
        for (const payload of payloads)
          for (const qos of [0, 1, 2] as const)
            for (const retain of [false, true]) {
              const dup = qos > 0 && retain;
              const bytes = mqtt.generate({ cmd: "publish", topic, payload, qos, messageId: qos > 0 ? 1 + n : undefined, retain, dup } as Packet, { protocolVersion: version });
              const [f] = new MqttFramer(1 << 20).feed(bytes);
              const mine = decodeFast(f!, version) as mqtt.IPublishPacket;
              const ref = reference(bytes, version) as mqtt.IPublishPacket;
              expect(mine).not.toBeNull();
              expect(mine.topic).toBe(ref.topic);
              expect(Buffer.from(mine.payload as Buffer)).toEqual(Buffer.from(ref.payload as Buffer));
              expect([mine.qos, mine.retain, mine.dup, mine.messageId]).toEqual([ref.qos, ref.retain, ref.dup, ref.messageId]);
              n++;
            }
      expect(n).toBe(topics.length * payloads.length * 6);
    });
  }

  test("reads PUBACK and PINGREQ", () => {
    const [a] = new MqttFramer(100).feed(mqtt.generate({ cmd: "puback", messageId: 513 } as Packet));
    expect(decodeFast(a!, 4)).toEqual({ cmd: "puback", messageId: 513 } as Packet);
    const [p] = new MqttFramer(100).feed(mqtt.generate({ cmd: "pingreq" } as Packet));
    expect(decodeFast(p!, 5)).toEqual({ cmd: "pingreq" });
  });

  test("leaves to mqtt-packet what it does not handle: v5 PUBACK with a reason, other packets", () => {
    const failedAck = mqtt.generate({ cmd: "puback", messageId: 2, reasonCode: 0x80 } as Packet, { protocolVersion: 5 });
    const subscribe = mqtt.generate({ cmd: "subscribe", messageId: 3, subscriptions: [{ topic: "a/#", qos: 1 }] } as Packet);
    for (const [bytes, version] of [
      [failedAck, 5],
      [subscribe, 4],
    ] as const) {
      const [f] = new MqttFramer(1 << 20).feed(bytes);
      expect(decodeFast(f!, version)).toBeNull();
    }
  });

  test("reads a v5 PUBLISH's properties as mqtt-packet does, user properties in their order across names", () => {
    const properties = {
      payloadFormatIndicator: true,
      messageExpiryInterval: 70_000,
      contentType: "text/plain; charset=utf-8",
      responseTopic: "reply/here",
      correlationData: Buffer.from([0, 1, 0xff]),
      topicAlias: 3,
      userProperties: { a: ["1", "3"], b: "2" },
    };
    const bytes = mqtt.generate({ cmd: "publish", topic: "t/x", payload: Buffer.from("body"), qos: 1, messageId: 9, retain: true, dup: false, properties } as Packet, { protocolVersion: 5 });
    const [f] = new MqttFramer(1 << 20).feed(bytes);
    const p = decodeFast(f!, 5) as Publish;
    const ref = reference(bytes, 5) as Packet & { properties: typeof properties };
    expect({ topic: p.topic, payload: Buffer.from(p.payload as Buffer).toString(), retain: p.retain, messageId: p.messageId }).toEqual({ topic: "t/x", payload: "body", retain: true, messageId: 9 });
    expect(p.props).toEqual({
      payloadFormat: 1,
      messageExpiry: ref.properties.messageExpiryInterval,
      contentType: ref.properties.contentType,
      responseTopic: ref.properties.responseTopic,
      correlationData: new Uint8Array(ref.properties.correlationData),
      topicAlias: 3,
      // mqtt-packet writes a name's values together; the order on the wire is what keyop keeps.
      userProperties: [
        ["a", "1"],
        ["a", "3"],
        ["b", "2"],
      ],
    });
    // Interleaved names keep their order (mqtt-packet's object could not hold it).
    const props = encodePublishProperties({
      userProperties: [
        ["x", "1"],
        ["y", "2"],
        ["x", "3"],
      ],
    });
    expect(readPublishProperties(props, 0).props.userProperties).toEqual([
      ["x", "1"],
      ["y", "2"],
      ["x", "3"],
    ]);
  });

  test("a v5 PUBLISH with a repeated, unknown or client-forbidden property is a protocol error", () => {
    const publishWith = (props: number[]) => {
      const topic = [0, 1, 0x74];
      const body = [...topic, 0, 1, props.length, ...props, 0x78];
      return Buffer.from([0x32, body.length, ...body]);
    };
    for (const props of [
      [0x01, 1, 0x01, 1], // payload format twice
      [0x01, 2], // payload format 2
      [0x0b, 5], // subscription identifier from a client
      [0x27, 0, 0, 0, 1], // maximum packet size: not a PUBLISH property
    ]) {
      const [f] = new MqttFramer(1 << 20).feed(publishWith(props));
      expect(() => decodeFast(f!, 5)).toThrow(MqttFrameError);
    }
  });

  test("what encodePublishProperties writes, mqtt-packet reads back", () => {
    const props = encodePublishProperties({
      payloadFormat: 1,
      messageExpiry: 5,
      contentType: "c",
      responseTopic: "r/t",
      correlationData: Uint8Array.of(7),
      subscriptionIds: [200],
      topicAlias: 2,
      userProperties: [["k", "v"]],
    });
    const bytes = Buffer.from(encodePublish(Buffer.from("t"), Buffer.from("p"), 2, 7, false, 5, true, props));
    const ref = reference(bytes, 5) as Packet & { properties: Record<string, unknown>; retain: boolean; qos: number };
    expect([ref.retain, ref.qos]).toEqual([true, 2]);
    expect(ref.properties).toEqual({
      payloadFormatIndicator: true,
      messageExpiryInterval: 5,
      contentType: "c",
      responseTopic: "r/t",
      correlationData: Buffer.from([7]),
      subscriptionIdentifier: 200,
      topicAlias: 2,
      userProperties: { k: "v" },
    });
  });
});

describe("encodePublish", () => {
  for (const version of [4, 5]) {
    test(`writes the bytes mqtt-packet generates (MQTT ${version === 5 ? "5" : "3.1.1"})`, () => {
      for (const topic of topics)
        for (const payload of [...payloads, Buffer.alloc(3_000_000, 2)])
          for (const qos of [0, 1] as const)
            for (const dup of [false, true]) {
              const id = qos > 0 ? 65_535 : undefined;
              const ref = mqtt.generate({ cmd: "publish", topic, payload, qos, messageId: id, retain: false, dup: dup && qos > 0 } as Packet, { protocolVersion: version });
              expect(Buffer.from(encodePublish(Buffer.from(topic), payload, qos, id, dup, version))).toEqual(ref as Buffer<ArrayBuffer>);
            }
    });
  }
});
