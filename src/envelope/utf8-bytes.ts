/**
 * A text payload held as the UTF-8 bytes it arrived as, already checked to
 * be valid UTF-8: the envelope writer copies the bytes into a msgpack str
 * as they are, where a string would be decoded from the wire only to be
 * encoded back into the same bytes (and left behind as garbage).
 *
 * The bytes are read when the envelope is built, within the publish call;
 * they may be a view of a buffer that is reused afterwards.
 */
export class Utf8Bytes {
  constructor(readonly bytes: Uint8Array) {}

  /** The text, for the paths that need a string (msgpackr's, an in-process reply). */
  toString(): string {
    return decoder.decode(this.bytes);
  }

  toJSON(): string {
    return this.toString();
  }
}

const decoder = new TextDecoder();
