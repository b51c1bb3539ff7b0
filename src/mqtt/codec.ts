/**
 * The MQTT packets of the message path, read and written by hand: the
 * stream split into whole packets, PUBLISH, PUBACK and PINGREQ decoded, and
 * PUBLISH encoded, MQTT 5 properties included (src/mqtt/properties.ts:
 * mqtt-packet keeps user properties in an object, which loses their order
 * across names). Everything else (CONNECT, SUBSCRIBE, a malformed
 * packet) is handed whole to mqtt-packet, which knows every corner of
 * both protocol versions.
 *
 * Why: per message, mqtt-packet's parser walks a state machine over a
 * buffer list, emits an event and builds a packet object through a dozen
 * calls, and its generator validates and allocates per field. At the rates
 * boards run that was the largest share of the listener's CPU after the
 * socket itself (docs/benchmarks.md). Pure functions: no socket here.
 */
import type { IPublishPacket, Packet } from "mqtt-packet";
import { uninitialized } from "../bytes.ts";
import { MqttFrameError } from "./frame-error.ts";
import { readPublishProperties, type PublishProperties } from "./properties.ts";

export { MqttFrameError };

/** A PUBLISH as read by hand: mqtt-packet's shape, MQTT 5 properties in keyop's (in order). */
export type Publish = IPublishPacket & { props?: PublishProperties };

/** A whole MQTT packet: its first byte and the bytes after the remaining length. */
export interface Frame {
  /** Packet type (the first byte's high nibble). */
  type: number;
  /** The first byte's low nibble. */
  flags: number;
  /** The variable header and payload. */
  body: Buffer;
  /** Bytes of the fixed header ahead of `body` (see `frameBytes`). */
  head: number;
}

/** Splits a byte stream into whole packets; keeps a partial one until the rest arrives. */
export class MqttFramer {
  private rest: Buffer | null = null;

  constructor(private readonly maxPacketBytes: number) {}

  /**
   * The whole packets in what came so far; throws MqttFrameError when a
   * remaining length is malformed or above `maxPacketBytes` (checked as soon
   * as the length is known, before its bytes are kept).
   */
  feed(chunk: Buffer): Frame[] {
    let buf = chunk;
    if (this.rest !== null) {
      buf = Buffer.concat([this.rest, chunk]);
      this.rest = null;
    }
    const frames: Frame[] = [];
    let at = 0;
    while (at < buf.length) {
      checkFirstByte(buf[at]!);
      // Fixed header: one byte, then 1-4 bytes of remaining length, 7 bits each.
      let len = 0;
      let mul = 1;
      let i = at + 1;
      let complete = false;
      for (let n = 0; n < 4 && i < buf.length; n++) {
        const b = buf[i++]!;
        len += (b & 0x7f) * mul;
        mul *= 128;
        if ((b & 0x80) === 0) {
          complete = true;
          break;
        }
        if (n === 3) throw new MqttFrameError("malformed packet: remaining length longer than 4 bytes", 0x81);
      }
      if (!complete) break;
      if (len > this.maxPacketBytes) throw new MqttFrameError(`packet of ${len} bytes exceeds mqtt.max_packet_bytes (${this.maxPacketBytes})`, 0x95);
      if (i + len > buf.length) break;
      const first = buf[at]!;
      frames.push({ type: first >> 4, flags: first & 0x0f, body: buf.subarray(i, i + len), head: i - at });
      at = i + len;
    }
    if (at < buf.length) this.rest = Buffer.from(buf.subarray(at));
    return frames;
  }
}

/**
 * The whole packet of `f`, fixed header included, as a view: made only for
 * the packets the fast decoder leaves to mqtt-packet, not for every frame.
 */
export function frameBytes(f: Frame): Buffer {
  return Buffer.from(f.body.buffer, f.body.byteOffset - f.head, f.body.length + f.head);
}

/**
 * The fixed header's first byte as MQTT allows it: type 0 is reserved, and
 * every type but PUBLISH has fixed flags. Checked before the length, so a
 * client speaking something else (HTTP, say) is cut off at its first byte
 * instead of being waited for.
 */
function checkFirstByte(first: number): void {
  const type = first >> 4;
  const flags = first & 0x0f;
  if (type === 0) throw new MqttFrameError("malformed packet: reserved packet type 0", 0x81);
  if (type === PUBLISH) {
    if ((flags & 6) === 6) throw new MqttFrameError("malformed packet: PUBLISH with QoS 3", 0x81);
    return;
  }
  const required = type === 6 || type === 8 || type === 10 ? 2 : 0;
  if (flags !== required) throw new MqttFrameError(`malformed packet: flags ${flags} of packet type ${type} (must be ${required})`, 0x81);
}

const PUBLISH = 3;
const PUBACK = 4;
const PINGREQ = 12;

/**
 * The packet in `f` if it is one of the message path's (a PUBLISH, a
 * PUBACK with success, a PINGREQ); null for everything else, which goes to
 * mqtt-packet. Throws MqttFrameError for a PUBLISH whose properties are
 * malformed or not allowed.
 */
export function decodeFast(f: Frame, version: number, topics?: LastTopic): Packet | null {
  if (f.type === PUBLISH) return decodePublish(f, version, topics);
  if (f.type === PUBACK && f.body.length === 2 && f.flags === 0) return { cmd: "puback", messageId: (f.body[0]! << 8) | f.body[1]! } as Packet;
  if (f.type === PINGREQ && f.body.length === 0 && f.flags === 0) return { cmd: "pingreq" };
  return null;
}

/**
 * The topic of a connection's last PUBLISH, as bytes and as its string: a
 * client that publishes on the same topic again gets the same string back,
 * compared byte for byte rather than decoded again.
 */
export class LastTopic {
  private bytes = new Uint8Array(0);
  private text = "";

  /** The topic in `b` from `start` to `end`, as UTF-8 (what cannot be decoded as U+FFFD, as Buffer does). */
  of(b: Buffer, start: number, end: number): string {
    const n = end - start;
    const last = this.bytes;
    if (n === last.length) {
      let i = 0;
      while (i < n && b[start + i] === last[i]) i++;
      if (i === n) return this.text;
    }
    this.bytes = new Uint8Array(b.subarray(start, end));
    this.text = b.toString("utf8", start, end);
    return this.text;
  }
}

function decodePublish(f: Frame, version: number, topics: LastTopic | undefined): Publish | null {
  const qos = (f.flags >> 1) & 3;
  if (qos === 3) return null;
  const b = f.body;
  if (b.length < 2) return null;
  const topicLen = (b[0]! << 8) | b[1]!;
  let at = 2 + topicLen;
  if (at > b.length) return null;
  const topic = topics ? topics.of(b, 2, at) : b.toString("utf8", 2, at);
  let messageId: number | undefined;
  if (qos > 0) {
    if (at + 2 > b.length) return null;
    messageId = (b[at]! << 8) | b[at + 1]!;
    if (messageId === 0) return null;
    at += 2;
  }
  let props: PublishProperties | undefined;
  if (version === 5) {
    if (at < b.length && b[at] === 0) at += 1;
    else {
      const r = readPublishProperties(b, at);
      props = r.props;
      at = r.end;
    }
  }
  const p: Publish = { cmd: "publish", topic, payload: b.subarray(at), qos: qos as 0 | 1 | 2, retain: (f.flags & 1) === 1, dup: (f.flags & 8) === 8, messageId };
  if (props) p.props = props;
  return p;
}

/** Bytes of a remaining length. */
function varintSize(n: number): number {
  return n < 128 ? 1 : n < 16_384 ? 2 : n < 2_097_152 ? 3 : 4;
}

/** Bytes of a PUBLISH with `payloadBytes` of payload (`props`: the MQTT 5 property block, one byte when empty). */
export function publishSize(topicBytes: number, payloadBytes: number, qos: number, version: number, propsBytes = 1): number {
  const rest = 2 + topicBytes + (qos > 0 ? 2 : 0) + (version === 5 ? propsBytes : 0) + payloadBytes;
  return 1 + varintSize(rest) + rest;
}

/**
 * A PUBLISH as keyop sends them to subscribers, its topic given as UTF-8
 * bytes (a session keeps them per channel; empty under a topic alias);
 * `props` is the MQTT 5 property block (from encodePublishProperties;
 * none: an empty one).
 */
export function encodePublish(
  topic: Uint8Array,
  payload: Uint8Array,
  qos: 0 | 1 | 2,
  messageId: number | undefined,
  dup: boolean,
  version: number,
  retain = false,
  props: Uint8Array | null = null,
): Uint8Array {
  const topicLen = topic.length;
  const rest = 2 + topicLen + (qos > 0 ? 2 : 0) + (version === 5 ? (props?.length ?? 1) : 0) + payload.length;
  const out = uninitialized(1 + varintSize(rest) + rest);
  out[0] = 0x30 | (dup && qos > 0 ? 8 : 0) | (qos << 1) | (retain ? 1 : 0);
  let at = 1;
  let n = rest;
  do {
    let byte = n % 128;
    n = Math.floor(n / 128);
    if (n > 0) byte |= 0x80;
    out[at++] = byte;
  } while (n > 0);
  out[at++] = topicLen >> 8;
  out[at++] = topicLen & 0xff;
  out.set(topic, at);
  at += topicLen;
  if (qos > 0) {
    out[at++] = (messageId! >> 8) & 0xff;
    out[at++] = messageId! & 0xff;
  }
  if (version === 5) {
    if (props) {
      out.set(props, at);
      at += props.length;
    } else out[at++] = 0;
  }
  out.set(payload, at);
  return out;
}
