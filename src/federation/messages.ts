/**
 * The messages carried in frames, with a validator for each: every field
 * from a peer is checked for type and bounds, channel names and patterns
 * are validated again (no path tricks over the wire), and anything off is a
 * `FrameError`. Names claimed in a HELLO are informational only; a peer's
 * identity is its certificate's CN.
 */
import { setU16BE, setU32BE, uninitialized } from "../bytes.ts";
import { assertChannel, assertPattern } from "../envelope/names.ts";
import { utf8Bytes } from "../envelope/scan.ts";
import { KeyopError } from "../errors.ts";
import { encodeFrame, FrameError, FrameType, HARD_MAX_BODY, HEADER_BYTES, MAGIC, PROTOCOL_VERSION, type Frame } from "./frame.ts";

/** Most patterns one side may state in a HELLO or WELCOME. */
export const MAX_PATTERNS = 256;
/** Most records in one BATCH. */
export const MAX_BATCH_RECORDS = 100_000;

/** First frame of a connection, sent by the connecting side. */
export interface Hello {
  /** Protocol versions the sender speaks. */
  versions: number[];
  /** Claimed name, for logs only. */
  name: string;
  /** `link`: durable store and forward; `ephemeral`: live only, no cursor kept. */
  mode: "link" | "ephemeral";
  /** Channels the sender wants to send up. */
  publish: string[];
  /** Channels the sender wants to receive. */
  subscribe: string[];
  heartbeatMs: number;
  maxBatchBytes: number;
  /**
   * Where the hub starts a cursor it makes for this peer the first time
   * (the link's `start`); absent means latest. Sent only when earliest.
   */
  start?: "earliest";
  /** Codecs the sender can compress and decompress BATCHes with, preferred first (key `cmp`; absent: none). */
  compression?: string[];
}

/** The hub's answer: the version chosen and what the peer is allowed. */
export interface Welcome {
  version: number;
  name: string;
  publish: string[];
  subscribe: string[];
  heartbeatMs: number;
  maxBatchBytes: number;
  /** The codec both sides compress BATCHes with from now on (key `cmp`; absent: none). */
  compression?: string;
}

/** Stored records of one channel, in seq order, as the sender stored them. */
export interface Batch {
  /** Batch number on this connection and direction, from 1. */
  batch: number;
  channel: string;
  /** Sender's seq of each record (same length as `records`). */
  seqs: number[];
  /** Stored envelope bodies (msgpack), forwarded as they are. */
  records: Uint8Array[];
  /**
   * The sender has window to spare after this batch, so the receiver may
   * hold its ACK briefly and send it with later ones (key `d`). Absent: ACK
   * as soon as it is stored (someone waits on it, or the window is full).
   */
  delayAck?: boolean;
}

/** Receiver stored (or deliberately dropped) everything of `channel` up to sender seq `upto`. */
export interface Ack {
  batch: number;
  channel: string;
  upto: number;
}

/**
 * Heartbeat and its answer; `t` is the sender's clock, echoed back for RTT.
 * A PING may carry `r`, the round trip its sender measured last (ms): the
 * side that answers and does not ping learns it so.
 */
export interface Ping {
  t: number;
  r?: number;
}

/** Last frame before closing, with a reason. */
export interface Close {
  code: string;
  reason: string;
}

function str(b: Record<string, unknown>, k: string, max = 1024): string {
  const v = b[k];
  if (typeof v !== "string" || v.length > max) throw new FrameError(`field "${k}" must be a string of at most ${max} bytes`);
  return v;
}

function int(b: Record<string, unknown>, k: string, min = 0, max = Number.MAX_SAFE_INTEGER): number {
  const v = b[k];
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) throw new FrameError(`field "${k}" must be an integer from ${min} to ${max}`);
  return v;
}

function patterns(b: Record<string, unknown>, k: string): string[] {
  const v = b[k];
  if (!Array.isArray(v) || v.length > MAX_PATTERNS) throw new FrameError(`field "${k}" must be a list of at most ${MAX_PATTERNS} patterns`);
  return v.map((p, i) => {
    try {
      assertPattern(p);
      return p;
    } catch (err) {
      throw new FrameError(`${k}[${i}]: ${err instanceof KeyopError ? err.message : String(err)}`);
    }
  });
}

function channel(b: Record<string, unknown>, k: string): string {
  const v = b[k];
  try {
    assertChannel(v);
    return v;
  } catch (err) {
    throw new FrameError(`field "${k}": ${err instanceof KeyopError ? err.message : String(err)}`);
  }
}

function expectType(f: Frame, t: number, what: string): Record<string, unknown> {
  if (f.type !== t) throw new FrameError(`expected ${what}`);
  return f.body;
}

/**
 * The HELLO a connecting side sends: this build's protocol versions, and
 * `start` only when it is earliest (absent means latest).
 */
export function clientHello(h: Omit<Hello, "versions" | "start"> & { start?: "latest" | "earliest" }): Hello {
  const { start, ...rest } = h;
  return { versions: [PROTOCOL_VERSION], ...rest, ...(start === "earliest" ? { start } : {}) };
}

/** Encodes a HELLO frame. */
export function helloFrame(h: Hello): Uint8Array {
  const body: Record<string, unknown> = { v: h.versions, name: h.name, mode: h.mode, pub: h.publish, sub: h.subscribe, hb: h.heartbeatMs, mbb: h.maxBatchBytes };
  if (h.start === "earliest") body.st = "earliest";
  if (h.compression && h.compression.length > 0) body.cmp = h.compression;
  return encodeFrame(FrameType.HELLO, body);
}

/** Validates a HELLO. */
export function parseHello(f: Frame): Hello {
  const b = expectType(f, FrameType.HELLO, "HELLO");
  const v = b.v;
  if (!Array.isArray(v) || v.length === 0 || v.length > 16 || !v.every((x) => Number.isInteger(x) && x > 0 && x < 256)) {
    throw new FrameError('field "v" must list the protocol versions spoken');
  }
  const mode = b.mode;
  if (mode !== "link" && mode !== "ephemeral") throw new FrameError('field "mode" must be "link" or "ephemeral"');
  if (b.st !== undefined && b.st !== "earliest" && b.st !== "latest") throw new FrameError('field "st" must be "earliest" or "latest"');
  const hello: Hello = {
    versions: v as number[],
    name: str(b, "name", 128),
    mode,
    publish: patterns(b, "pub"),
    subscribe: patterns(b, "sub"),
    heartbeatMs: int(b, "hb", 100, 3_600_000),
    maxBatchBytes: int(b, "mbb", 1024, 64 * 1024 * 1024),
  };
  if (b.st === "earliest") hello.start = "earliest";
  if (b.cmp !== undefined) {
    const c = b.cmp;
    if (!Array.isArray(c) || c.length > 16 || !c.every((x) => typeof x === "string" && x.length > 0 && x.length <= 32)) {
      throw new FrameError('field "cmp" must list codec names');
    }
    hello.compression = c as string[];
  }
  return hello;
}

/** The highest version both sides speak, or null. */
export function chooseVersion(theirs: number[]): number | null {
  return theirs.includes(PROTOCOL_VERSION) ? PROTOCOL_VERSION : null;
}

/** Encodes a WELCOME frame. */
export function welcomeFrame(w: Welcome): Uint8Array {
  const body: Record<string, unknown> = { v: w.version, name: w.name, pub: w.publish, sub: w.subscribe, hb: w.heartbeatMs, mbb: w.maxBatchBytes };
  if (w.compression) body.cmp = w.compression;
  return encodeFrame(FrameType.WELCOME, body);
}

/** Validates a WELCOME. */
export function parseWelcome(f: Frame): Welcome {
  const b = expectType(f, FrameType.WELCOME, "WELCOME");
  const w: Welcome = {
    version: int(b, "v", 1, 255),
    name: str(b, "name", 128),
    publish: patterns(b, "pub"),
    subscribe: patterns(b, "sub"),
    heartbeatMs: int(b, "hb", 100, 3_600_000),
    maxBatchBytes: int(b, "mbb", 1024, 64 * 1024 * 1024),
  };
  if (b.cmp !== undefined) w.compression = str(b, "cmp", 32);
  return w;
}

/**
 * Encodes a BATCH frame (record bodies go out as the bytes they are stored
 * as). Written by hand into one buffer of the exact size, since it is the
 * one frame that carries megabytes: the generic path packed into msgpackr's
 * buffer and copied the result again. The bytes are the same as
 * `encodeFrame(BATCH, {n, c, s, r})` gives (the tests check it).
 */
export function batchFrame(bt: Batch, maxBody = HARD_MAX_BODY): Uint8Array {
  return writeBatch(bt.batch, bt.channel, bt.records.length, bt.seqs, bt.records, null, bt.delayAck === true, maxBody);
}

/** A stored record as a link sends it: its seq and its bytes. */
export interface SeqBody {
  readonly seq: number;
  readonly body: Uint8Array;
}

/**
 * `batchFrame` of every record of `items`, in order: for a forwarder that
 * sends all a fetch gave, without building the seqs' and the bodies' arrays
 * and the `Batch` first (one set per forwarded message at a board's rate).
 */
export function batchFrameOf(batch: number, channel: string, items: readonly SeqBody[], delayAck: boolean, maxBody = HARD_MAX_BODY): Uint8Array {
  return writeBatch(batch, channel, items.length, null, null, items, delayAck, maxBody);
}

/** The BATCH of `n` records: seqs and bodies from `seqs` and `bodies`, or both from `items`. */
function writeBatch(
  batch: number,
  ch: string,
  n: number,
  seqs: readonly number[] | null,
  bodies: readonly Uint8Array[] | null,
  items: readonly SeqBody[] | null,
  delayAck: boolean,
  maxBody: number,
): Uint8Array {
  const channelBytes = utf8Bytes(ch);
  let size = 3 + 2 + uintSize(batch) + 2 + strHeaderSize(channelBytes.length) + channelBytes.length + 2 + arrayHeaderSize(n) + 2 + arrayHeaderSize(n);
  for (let i = 0; i < n; i++) {
    const len = items ? items[i]!.body.length : bodies![i]!.length;
    size += uintSize(items ? items[i]!.seq : seqs![i]!) + binHeaderSize(len) + len;
  }
  if (delayAck) size += 3; // "d": true
  if (size > maxBody) throw new FrameError(`BATCH body of ${size} bytes exceeds ${maxBody}`);
  const out = uninitialized(HEADER_BYTES + size);
  setU16BE(out, 0, MAGIC);
  out[2] = PROTOCOL_VERSION;
  out[3] = FrameType.BATCH;
  setU32BE(out, 4, size);
  let at = HEADER_BYTES;
  // map16, as msgpackr writes objects
  out[at++] = 0xde;
  out[at++] = 0;
  out[at++] = delayAck ? 5 : 4;
  at = fixKey(out, at, 0x6e); // "n"
  at = writeUint(out, at, batch);
  at = fixKey(out, at, 0x63); // "c"
  at = writeStrHeader(out, at, channelBytes.length);
  out.set(channelBytes, at);
  at += channelBytes.length;
  at = fixKey(out, at, 0x73); // "s"
  at = writeArrayHeader(out, at, n);
  for (let i = 0; i < n; i++) at = writeUint(out, at, items ? items[i]!.seq : seqs![i]!);
  at = fixKey(out, at, 0x72); // "r"
  at = writeArrayHeader(out, at, n);
  for (let i = 0; i < n; i++) {
    const r = items ? items[i]!.body : bodies![i]!;
    if (r.length <= 0xff) {
      out[at++] = 0xc4;
      out[at++] = r.length;
    } else if (r.length <= 0xffff) {
      out[at++] = 0xc5;
      setU16BE(out, at, r.length);
      at += 2;
    } else {
      out[at++] = 0xc6;
      setU32BE(out, at, r.length);
      at += 4;
    }
    out.set(r, at);
    at += r.length;
  }
  if (delayAck) {
    at = fixKey(out, at, 0x64); // "d"
    out[at++] = 0xc3;
  }
  return out;
}

const uintSize = (v: number) => (v < 0x80 ? 1 : v <= 0xff ? 2 : v <= 0xffff ? 3 : v <= 0xffffffff ? 5 : 9);
const strHeaderSize = (len: number) => (len < 32 ? 1 : len <= 0xff ? 2 : len <= 0xffff ? 3 : 5);
const arrayHeaderSize = (len: number) => (len < 16 ? 1 : len <= 0xffff ? 3 : 5);
const binHeaderSize = (len: number) => (len <= 0xff ? 2 : len <= 0xffff ? 3 : 5);

function fixKey(out: Uint8Array, at: number, ch: number): number {
  out[at] = 0xa1;
  out[at + 1] = ch;
  return at + 2;
}

function writeUint(out: Uint8Array, at: number, v: number): number {
  if (v < 0x80) out[at++] = v;
  else if (v <= 0xff) {
    out[at++] = 0xcc;
    out[at++] = v;
  } else if (v <= 0xffff) {
    out[at++] = 0xcd;
    setU16BE(out, at, v);
    at += 2;
  } else if (v <= 0xffffffff) {
    out[at++] = 0xce;
    setU32BE(out, at, v);
    at += 4;
  } else {
    out[at++] = 0xcf;
    setU32BE(out, at, Math.floor(v / 0x1_0000_0000));
    setU32BE(out, at + 4, v % 0x1_0000_0000);
    at += 8;
  }
  return at;
}

function writeStrHeader(out: Uint8Array, at: number, len: number): number {
  if (len < 32) out[at++] = 0xa0 | len;
  else if (len <= 0xff) {
    out[at++] = 0xd9;
    out[at++] = len;
  } else if (len <= 0xffff) {
    out[at++] = 0xda;
    setU16BE(out, at, len);
    at += 2;
  } else {
    out[at++] = 0xdb;
    setU32BE(out, at, len);
    at += 4;
  }
  return at;
}

function writeArrayHeader(out: Uint8Array, at: number, len: number): number {
  if (len < 16) out[at++] = 0x90 | len;
  else if (len <= 0xffff) {
    out[at++] = 0xdc;
    setU16BE(out, at, len);
    at += 2;
  } else {
    out[at++] = 0xdd;
    setU32BE(out, at, len);
    at += 4;
  }
  return at;
}

/** Validates a BATCH: channel name, consecutive-or-rising seqs, binary records. */
export function parseBatch(f: Frame): Batch {
  const b = expectType(f, FrameType.BATCH, "BATCH");
  const seqs = b.s;
  const records = b.r;
  if (!Array.isArray(seqs) || !Array.isArray(records) || seqs.length !== records.length || seqs.length === 0 || seqs.length > MAX_BATCH_RECORDS) {
    throw new FrameError(`fields "s" and "r" must be lists of the same length, 1..${MAX_BATCH_RECORDS}`);
  }
  let prev = 0;
  for (const s of seqs) {
    if (typeof s !== "number" || !Number.isInteger(s) || s <= prev) throw new FrameError('field "s" must hold rising positive integer seqs');
    prev = s;
  }
  for (const r of records) if (!(r instanceof Uint8Array) || r.length === 0) throw new FrameError('field "r" must hold non-empty binary records');
  if (b.d !== undefined && typeof b.d !== "boolean") throw new FrameError('field "d" must be a boolean');
  const batch: Batch = { batch: int(b, "n", 1), channel: channel(b, "c"), seqs: seqs as number[], records: records as Uint8Array[] };
  if (b.d === true) batch.delayAck = true;
  return batch;
}

/**
 * Encodes an ACK frame: by hand, as `batchFrame`, since one goes out per
 * batch; the bytes are those of `encodeFrame(ACK, {n, c, u})` (tested).
 */
export function ackFrame(a: Ack): Uint8Array {
  const channelBytes = utf8Bytes(a.channel);
  const size = 3 + 2 + uintSize(a.batch) + 2 + strHeaderSize(channelBytes.length) + channelBytes.length + 2 + uintSize(a.upto);
  const out = new Uint8Array(HEADER_BYTES + size);
  setU16BE(out, 0, MAGIC);
  out[2] = PROTOCOL_VERSION;
  out[3] = FrameType.ACK;
  setU32BE(out, 4, size);
  let at = HEADER_BYTES;
  out[at++] = 0xde; // map16, as msgpackr writes objects
  out[at++] = 0;
  out[at++] = 3;
  at = fixKey(out, at, 0x6e); // "n"
  at = writeUint(out, at, a.batch);
  at = fixKey(out, at, 0x63); // "c"
  at = writeStrHeader(out, at, channelBytes.length);
  out.set(channelBytes, at);
  at += channelBytes.length;
  at = fixKey(out, at, 0x75); // "u"
  writeUint(out, at, a.upto);
  return out;
}

/** Validates an ACK. */
export function parseAck(f: Frame): Ack {
  const b = expectType(f, FrameType.ACK, "ACK");
  return { batch: int(b, "n", 1), channel: channel(b, "c"), upto: int(b, "u", 1) };
}

/** A reply on its way back to the requester: the request's inbox and the reply's envelope. */
export interface Reply {
  inbox: string;
  body: Uint8Array;
}

/** Encodes a REPLY frame. */
export function replyFrame(r: Reply): Uint8Array {
  return encodeFrame(FrameType.REPLY, { i: r.inbox, r: r.body });
}

/** Validates a REPLY: an inbox channel and a non-empty envelope. */
export function parseReply(f: Frame): Reply {
  const b = expectType(f, FrameType.REPLY, "REPLY");
  const inbox = channel(b, "i");
  if (!inbox.startsWith("_inbox.")) throw new FrameError('field "i" must be an inbox (_inbox.<id>)');
  const body = b.r;
  if (!(body instanceof Uint8Array) || body.length === 0) throw new FrameError('field "r" must hold the reply envelope');
  return { inbox, body };
}

/** Encodes a PING or PONG frame. */
export function pingFrame(p: Ping): Uint8Array {
  return encodeFrame(FrameType.PING, p.r === undefined ? { t: p.t } : { t: p.t, r: p.r });
}

/** Encodes the PONG answering a PING (its time echoed). */
export function pongFrame(p: Ping): Uint8Array {
  return encodeFrame(FrameType.PONG, { t: p.t });
}

/** Validates a PING or PONG. */
export function parsePing(f: Frame): Ping {
  if (f.type !== FrameType.PING && f.type !== FrameType.PONG) throw new FrameError("expected PING or PONG");
  const t = f.body.t;
  if (typeof t !== "number" || !Number.isFinite(t)) throw new FrameError('field "t" must be a number');
  const r = f.body.r;
  if (r === undefined || f.type === FrameType.PONG) return { t };
  if (typeof r !== "number" || !Number.isFinite(r) || r < 0) throw new FrameError('field "r" must be a non-negative number');
  return { t, r };
}

/** Encodes a CLOSE frame. */
export function closeFrame(c: Close): Uint8Array {
  return encodeFrame(FrameType.CLOSE, { code: c.code, reason: c.reason.slice(0, 512) });
}

/** Validates a CLOSE. */
export function parseClose(f: Frame): Close {
  const b = expectType(f, FrameType.CLOSE, "CLOSE");
  return { code: str(b, "code", 64), reason: str(b, "reason", 1024) };
}
