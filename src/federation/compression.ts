/**
 * Compression of BATCH frames (docs/protocol.md): which codecs a side
 * offers for a `federation.compression` setting, the one a hub picks from
 * what a peer offers, and the COMPRESSED frame that carries a compressed
 * BATCH. A batch below MIN_COMPRESS_BYTES, or one that does not shrink by
 * a tenth, goes as it is. Decompression is bounded by the receiver's frame
 * limit, so a small frame cannot expand into a large allocation.
 */
import { deflateRawSync, inflateRawSync, zstdDecompressSync } from "node:zlib";
import type { CompressionSetting } from "../config/schema.ts";
import { decodeFrameBody, encodeFrame, FrameError, FrameType, HEADER_BYTES, type Frame } from "./frame.ts";

/** A codec both sides may speak. */
export type Codec = "zstd" | "deflate";

const CODECS: readonly Codec[] = ["zstd", "deflate"];

/**
 * Frames smaller than this go as they are. At steady rates a batch carries
 * a record or two, and compressing those cost more CPU than the bytes were
 * worth; a backlog, where compression pays, travels in large batches.
 */
export const MIN_COMPRESS_BYTES = 4096;

/** What a side offers (a client) or accepts (a hub), in its order of preference. */
export function codecsFor(setting: CompressionSetting): Codec[] {
  if (setting === "auto") return [...CODECS];
  if (setting === "none") return [];
  return [setting];
}

/** The hub's choice: the first codec of its own list that the peer offered, or undefined. */
export function chooseCodec(offered: readonly string[], accepted: readonly Codec[]): Codec | undefined {
  return accepted.find((c) => offered.includes(c));
}

/** Whether `v` names a codec this build knows. */
export function isCodec(v: unknown): v is Codec {
  return v === "zstd" || v === "deflate";
}

function squeeze(codec: Codec, bytes: Uint8Array): Uint8Array {
  return codec === "zstd" ? Bun.zstdCompressSync(bytes, { level: 3 }) : deflateRawSync(bytes);
}

/**
 * The frame to put on the wire for `frame` (a whole encoded frame): a
 * COMPRESSED frame around it when that is at least a tenth smaller, else
 * `frame` itself.
 */
export function compressFrame(codec: Codec, frame: Uint8Array): Uint8Array {
  if (frame.length < MIN_COMPRESS_BYTES) return frame;
  const z = squeeze(codec, frame.subarray(HEADER_BYTES));
  if (z.length + 32 > frame.length * 0.9) return frame;
  return encodeFrame(FrameType.COMPRESSED, { a: codec, t: frame[3]!, z });
}

/**
 * The frame inside a COMPRESSED frame, checked as any frame is: only a
 * BATCH may be compressed, with the codec the session agreed on, and it
 * may not expand past `maxBody`.
 */
export function decompressFrame(f: Frame, codec: Codec | undefined, maxBody: number): Frame {
  if (!codec) throw new FrameError("COMPRESSED frame on a session that agreed on no compression");
  const { a, t, z } = f.body;
  if (a !== codec) throw new FrameError(`COMPRESSED frame with codec ${JSON.stringify(a)}, the session agreed on ${codec}`);
  if (t !== FrameType.BATCH) throw new FrameError("only a BATCH may be compressed");
  if (!(z instanceof Uint8Array) || z.length === 0) throw new FrameError('field "z" must hold the compressed bytes');
  let inner: Uint8Array;
  try {
    inner = codec === "zstd" ? zstdDecompressSync(z, { maxOutputLength: maxBody }) : inflateRawSync(z, { maxOutputLength: maxBody });
  } catch (err) {
    throw new FrameError(`COMPRESSED ${codec} body does not decompress within ${maxBody} bytes (${err instanceof Error ? err.message : String(err)})`);
  }
  if (inner.length === 0) throw new FrameError("COMPRESSED frame holds an empty body");
  return decodeFrameBody(t, inner);
}
