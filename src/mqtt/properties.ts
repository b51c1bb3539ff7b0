/**
 * The MQTT 5 properties of a PUBLISH, read and written by hand, and how
 * they map to what keyop stores with a message (MessageMeta): user
 * properties in their order (a name may repeat), content type, payload
 * format indicator, response topic (as a channel) and correlation data as
 * given, and the message expiry interval as an absolute time, so that the
 * remaining interval can be sent at delivery, after any time in the log or
 * on a link. Pure functions: no socket, no session.
 */
import type { MessageMeta } from "../envelope/envelope.ts";
import { MqttFrameError } from "./frame-error.ts";
import { channelToTopic, topicToChannel } from "./topics.ts";

/** The properties a PUBLISH may carry. */
export interface PublishProperties {
  payloadFormat?: 0 | 1;
  /** Seconds. */
  messageExpiry?: number;
  contentType?: string;
  responseTopic?: string;
  correlationData?: Uint8Array;
  /** Server to client only. */
  subscriptionIds?: number[];
  topicAlias?: number;
  userProperties?: [string, string][];
}

const PFI = 0x01;
const MEI = 0x02;
const CONTENT_TYPE = 0x03;
const RESPONSE_TOPIC = 0x08;
const CORRELATION = 0x09;
const SUBSCRIPTION_ID = 0x0b;
const TOPIC_ALIAS = 0x23;
const USER_PROPERTY = 0x26;

const utf8 = new TextDecoder("utf-8", { fatal: true });
const encoder = new TextEncoder();

/** A protocol error in what the client sent (MQTT 5 reason 0x82, or 0x81 for malformed bytes). */
function bad(message: string, reason = 0x82): never {
  throw new MqttFrameError(message, reason);
}

/**
 * Reads the property block at `at` of a PUBLISH body (its length, then the
 * properties); returns them and where the payload starts. Throws
 * MqttFrameError on malformed bytes, an unknown or repeated property, or a
 * property a client may not send.
 */
export function readPublishProperties(b: Uint8Array, at: number): { props: PublishProperties; end: number } {
  let len = 0;
  let mul = 1;
  for (let n = 0; ; n++) {
    if (at >= b.length || n === 4) bad("malformed properties length", 0x81);
    const byte = b[at++]!;
    len += (byte & 0x7f) * mul;
    mul *= 128;
    if ((byte & 0x80) === 0) break;
  }
  const end = at + len;
  if (end > b.length) bad("properties longer than the packet", 0x81);
  const props: PublishProperties = {};
  const u16 = () => {
    if (at + 2 > end) bad("truncated property", 0x81);
    const v = (b[at]! << 8) | b[at + 1]!;
    at += 2;
    return v;
  };
  const bytes = () => {
    const n = u16();
    if (at + n > end) bad("truncated property", 0x81);
    const v = b.subarray(at, at + n);
    at += n;
    return v;
  };
  const text = () => {
    try {
      return utf8.decode(bytes());
    } catch {
      return bad("a property string is not UTF-8", 0x81);
    }
  };
  const once = (present: unknown, name: string) => {
    if (present !== undefined) bad(`${name} given twice`);
  };
  while (at < end) {
    const id = b[at++]!;
    switch (id) {
      case PFI: {
        once(props.payloadFormat, "payload format indicator");
        if (at >= end) bad("truncated property", 0x81);
        const v = b[at++]!;
        if (v > 1) bad("payload format indicator must be 0 or 1");
        props.payloadFormat = v as 0 | 1;
        break;
      }
      case MEI:
        once(props.messageExpiry, "message expiry interval");
        if (at + 4 > end) bad("truncated property", 0x81);
        props.messageExpiry = b[at]! * 0x1000000 + ((b[at + 1]! << 16) | (b[at + 2]! << 8) | b[at + 3]!);
        at += 4;
        break;
      case CONTENT_TYPE:
        once(props.contentType, "content type");
        props.contentType = text();
        break;
      case RESPONSE_TOPIC:
        once(props.responseTopic, "response topic");
        props.responseTopic = text();
        break;
      case CORRELATION:
        once(props.correlationData, "correlation data");
        props.correlationData = new Uint8Array(bytes());
        break;
      case TOPIC_ALIAS:
        once(props.topicAlias, "topic alias");
        props.topicAlias = u16();
        break;
      case USER_PROPERTY: {
        const name = text();
        const value = text();
        props.userProperties ??= [];
        props.userProperties.push([name, value]);
        break;
      }
      case SUBSCRIPTION_ID:
        bad("a client must not send a subscription identifier in a PUBLISH");
        break;
      default:
        bad(`property 0x${id.toString(16)} is not one of a PUBLISH`);
    }
  }
  return { props, end };
}

/**
 * What keyop stores of a publish's properties. `now` turns the expiry
 * interval into a time; a response topic becomes the channel it maps to
 * (throws the topic's error when it is not a topic name).
 */
export function metaOfPublish(props: PublishProperties | undefined, now: number): MessageMeta {
  const meta: MessageMeta = {};
  if (!props) return meta;
  if (props.messageExpiry !== undefined) meta.expires = now + props.messageExpiry * 1000;
  if (props.contentType !== undefined) meta.contentType = props.contentType;
  if (props.responseTopic !== undefined) meta.replyTo = topicToChannel(props.responseTopic);
  if (props.correlationData !== undefined) meta.correlationData = props.correlationData;
  if (props.userProperties !== undefined) meta.headers = props.userProperties;
  if (props.payloadFormat === 1) meta.utf8 = true;
  return meta;
}

/**
 * The properties of a PUBLISH to a subscriber: what was stored, the
 * remaining expiry at `now` (rounded up, so a message about to expire still
 * says one second), the matching subscriptions' identifiers and a topic
 * alias.
 */
export function publishPropertiesOf(meta: MessageMeta | null, now: number, subscriptionIds: readonly number[] = [], topicAlias?: number): PublishProperties {
  const p: PublishProperties = {};
  if (meta) {
    if (meta.utf8) p.payloadFormat = 1;
    if (meta.expires !== undefined) p.messageExpiry = Math.max(1, Math.ceil((meta.expires - now) / 1000));
    if (meta.contentType !== undefined) p.contentType = meta.contentType;
    if (meta.replyTo !== undefined) p.responseTopic = channelToTopic(meta.replyTo);
    if (meta.correlationData !== undefined) p.correlationData = meta.correlationData;
    if (meta.headers !== undefined) p.userProperties = meta.headers;
  }
  if (subscriptionIds.length > 0) p.subscriptionIds = [...subscriptionIds];
  if (topicAlias !== undefined) p.topicAlias = topicAlias;
  return p;
}

/** The property block (its length first) of `p`, as a PUBLISH carries it. */
export function encodePublishProperties(p: PublishProperties): Uint8Array {
  const parts: Uint8Array[] = [];
  const str = (id: number, s: Uint8Array) => {
    const out = new Uint8Array(3 + s.length);
    out[0] = id;
    out[1] = s.length >> 8;
    out[2] = s.length & 0xff;
    out.set(s, 3);
    parts.push(out);
  };
  if (p.payloadFormat !== undefined) parts.push(Uint8Array.of(PFI, p.payloadFormat));
  if (p.messageExpiry !== undefined) {
    const v = p.messageExpiry;
    parts.push(Uint8Array.of(MEI, (v >>> 24) & 0xff, (v >>> 16) & 0xff, (v >>> 8) & 0xff, v & 0xff));
  }
  if (p.contentType !== undefined) str(CONTENT_TYPE, encoder.encode(p.contentType));
  if (p.responseTopic !== undefined) str(RESPONSE_TOPIC, encoder.encode(p.responseTopic));
  if (p.correlationData !== undefined) str(CORRELATION, p.correlationData);
  if (p.topicAlias !== undefined) parts.push(Uint8Array.of(TOPIC_ALIAS, p.topicAlias >> 8, p.topicAlias & 0xff));
  for (const id of p.subscriptionIds ?? []) parts.push(Uint8Array.of(SUBSCRIPTION_ID, ...varint(id)));
  for (const [name, value] of p.userProperties ?? []) {
    const n = encoder.encode(name);
    const v = encoder.encode(value);
    const out = new Uint8Array(5 + n.length + v.length);
    out[0] = USER_PROPERTY;
    out[1] = n.length >> 8;
    out[2] = n.length & 0xff;
    out.set(n, 3);
    out[3 + n.length] = v.length >> 8;
    out[4 + n.length] = v.length & 0xff;
    out.set(v, 5 + n.length);
    parts.push(out);
  }
  let size = 0;
  for (const x of parts) size += x.length;
  const head = varint(size);
  const out = new Uint8Array(head.length + size);
  out.set(head, 0);
  let at = head.length;
  for (const x of parts) {
    out.set(x, at);
    at += x.length;
  }
  return out;
}

/** MQTT's variable byte integer. */
function varint(n: number): number[] {
  const out: number[] = [];
  do {
    let byte = n % 128;
    n = Math.floor(n / 128);
    if (n > 0) byte |= 0x80;
    out.push(byte);
  } while (n > 0);
  return out;
}

/** The empty property block: one zero byte. */
export const NO_PROPERTIES = Uint8Array.of(0);

/** Properties as mqtt-packet parses them (a will's, in CONNECT), in keyop's shape. */
export function fromPacketProperties(p: Record<string, unknown> | undefined): PublishProperties | undefined {
  if (!p) return undefined;
  const out: PublishProperties = {};
  if (p.payloadFormatIndicator === true || p.payloadFormatIndicator === 1) out.payloadFormat = 1;
  if (typeof p.messageExpiryInterval === "number") out.messageExpiry = p.messageExpiryInterval;
  if (typeof p.contentType === "string") out.contentType = p.contentType;
  if (typeof p.responseTopic === "string") out.responseTopic = p.responseTopic;
  if (p.correlationData instanceof Uint8Array) out.correlationData = new Uint8Array(p.correlationData);
  const user = p.userProperties as Record<string, string | string[]> | undefined;
  if (user && typeof user === "object") {
    out.userProperties = [];
    for (const [name, value] of Object.entries(user)) for (const v of Array.isArray(value) ? value : [value]) out.userProperties.push([name, String(v)]);
  }
  return out;
}
