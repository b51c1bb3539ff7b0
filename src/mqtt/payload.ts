/** MQTT payloads and the one packet written by hand, between the wire and the store. */

/**
 * A PUBACK with success, written by hand: the one packet sent per QoS 1
 * publish. Four bytes in MQTT 3.1.1 and 5.0 alike (5.0 lets the reason
 * code and properties go when the reason is success).
 */
export function pubackBytes(id: number): Uint8Array {
  return Uint8Array.of(0x40, 0x02, (id >> 8) & 0xff, id & 0xff);
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** MQTT payload bytes as stored: valid UTF-8 as a string (readable over HTTP), anything else as bytes. */
export function payloadOf(bytes: Uint8Array): string | Uint8Array {
  try {
    return utf8.decode(bytes);
  } catch {
    return new Uint8Array(bytes);
  }
}

/** A stored payload as MQTT bytes: bytes unchanged, strings as UTF-8, anything else as JSON. */
export function bytesOf(payload: unknown): Buffer {
  if (payload instanceof Uint8Array) return Buffer.from(payload);
  if (typeof payload === "string") return Buffer.from(payload, "utf8");
  return Buffer.from(JSON.stringify(payload ?? null), "utf8");
}
