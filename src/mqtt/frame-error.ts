/** The one error of the MQTT codec: what a client sent cannot be read, and the connection ends. */
import { KeyopError } from "../errors.ts";

/** The stream is not MQTT, a packet is larger than allowed, or it breaks the protocol; the connection cannot go on. */
export class MqttFrameError extends KeyopError {
  /** The MQTT 5 DISCONNECT reason: 0x95 packet too large, 0x81 malformed, 0x82 protocol error. */
  readonly reason: number;
  constructor(message: string, reason: number) {
    super("malformed_frame", message);
    this.reason = reason;
  }
}
