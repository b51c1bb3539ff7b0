/**
 * The envelope of a new publish, built and checked in one place for every
 * publisher (the durable `Messenger`, the hub-backed `EphemeralMessenger`):
 * the same mistake gets the same error, whichever path it came in by.
 */
import { InvalidArgumentError, ReservedChannelError, TooLargeError } from "../errors.ts";
import { assertLabel, encodeEnvelope } from "./envelope.ts";
import { assertChannel, isDeadLetter } from "./names.ts";
import { scanEnvelope } from "./scan.ts";

/** What a publisher supplies, with its labels already resolved (options, context, defaults). */
export interface NewMessage {
  channel: string;
  type: string;
  payload: unknown;
  correlationId?: string | undefined;
  serviceName?: string | undefined;
}

/** The stored body of a new message, with the id and time stamped into it. */
export interface BuiltEnvelope {
  body: Uint8Array;
  id: string;
  ts: number;
}

/**
 * Checks `m` (a channel that is not a dead-letter one, labels), encodes it
 * as first published by `origin`, and checks what every receiver checks
 * before storing a forwarded record: at most `maxBytes`, nesting and
 * extension types a hub accepts. A record a hub would refuse would
 * otherwise close the link at every resend and stop everything behind it.
 */
export function buildEnvelope(origin: string, m: NewMessage, maxBytes: number): BuiltEnvelope {
  assertChannel(m.channel);
  if (isDeadLetter(m.channel)) throw new ReservedChannelError(m.channel);
  return buildOnCheckedChannel(origin, m, maxBytes);
}

/**
 * `buildEnvelope` for a channel already checked, dead-letter channels
 * included: what a messenger itself stores when a handler gives up.
 */
export function buildOnCheckedChannel(origin: string, m: NewMessage, maxBytes: number): BuiltEnvelope {
  assertLabel(m.type, "type");
  if (m.correlationId !== undefined) assertLabel(m.correlationId, "correlation id");
  if (m.serviceName !== undefined) assertLabel(m.serviceName, "service name");
  const id = Bun.randomUUIDv7();
  const ts = Date.now();
  let body: Uint8Array;
  try {
    body = encodeEnvelope({ id, ts, channel: m.channel, origin, type: m.type, correlationId: m.correlationId, serviceName: m.serviceName, route: [origin], payload: m.payload });
  } catch (err) {
    throw new InvalidArgumentError(`payload cannot be encoded as msgpack: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (body.length > maxBytes) throw new TooLargeError(`message of ${body.length} bytes exceeds the limit of ${maxBytes}`);
  try {
    scanEnvelope(body);
  } catch (err) {
    throw new InvalidArgumentError(`payload cannot be forwarded: ${err instanceof Error ? err.message : String(err)}`);
  }
  return { body, id, ts };
}
