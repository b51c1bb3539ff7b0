/**
 * Pull, ack and delete of durable subscribers over HTTP:
 *
 *   GET    /v1/channels/{channel}/messages?subscriber=NAME&max=N&wait=MS&from=...
 *   POST   /v1/channels/{channel}/subscribers/{name}/ack   {"seq":N[,"channel":C]}
 *   DELETE /v1/channels/{channel}/subscribers/{name}
 *
 * `{channel}` may be a pattern. Pulling never moves the cursor: what was not
 * acked comes again on the next pull.
 */
import { assertChannel, isWildcard } from "../envelope/names.ts";
import { envelopeJson } from "../envelope/json.ts";
import { BadRequestError, InvalidArgumentError, UnknownSubscriberError } from "../errors.ts";
import type { Messenger } from "../messenger/messenger.ts";
import type { DurableSubscriber } from "../messenger/durable-subscriber.ts";
import { fromParam, intParam, json, readBody, requiredParam } from "./http.ts";

/** Longest long-poll wait (ms). */
export const MAX_WAIT_MS = 300_000;

/** GET messages: up to `max` after the cursor, waiting up to `wait` ms for the first. */
export async function handlePull(url: URL, pattern: string, messenger: Messenger, signal: AbortSignal): Promise<Response> {
  const name = requiredParam(url, "subscriber");
  const max = intParam(url, "max", 100, 1, 10_000);
  const wait = intParam(url, "wait", 0, 0, MAX_WAIT_MS);
  const sub = messenger.openSubscriber(pattern, name, { from: fromParam(url) });
  let msgs = await sub.fetch({ max });
  // A wake-up may find nothing (a matching channel was created before its first record): wait on.
  const deadline = performance.now() + wait;
  while (msgs.length === 0 && !signal.aborted) {
    const left = deadline - performance.now();
    if (left <= 0 || !(await sub.wait(left, { signal }))) break;
    msgs = await sub.fetch({ max });
  }
  const body = `{"messages":[${msgs.map(envelopeJson).join(",")}]}`;
  return new Response(body, { status: 200, headers: { "content-type": "application/json" } });
}

/**
 * The concrete channel an ack is for: the path's channel, or for a pattern
 * path the body's `channel` (inferred when the pattern matches one channel).
 */
/**
 * The channel an ack of `sub` is for: the one it names, else the channel of
 * the request's path (a pattern subscriber acked on one of its channels),
 * else the one channel its pattern matches.
 */
export function ackChannel(sub: DurableSubscriber, named: unknown, path: string = sub.pattern): string {
  if (named !== undefined) {
    if (typeof named !== "string") throw new BadRequestError(`"channel" must be a string`);
    assertChannel(named);
    return named;
  }
  if (!isWildcard(path)) return path;
  const channels = [...sub.positions().keys()];
  if (channels.length === 1) return channels[0]!;
  throw new BadRequestError(`an ack on pattern ${sub.pattern} needs "channel" (it matches ${channels.length} channels)`);
}

/**
 * POST ack: cumulative, moves the cursor past `seq`; for a subscriber
 * that is a queue group now, acks that one message.
 */
export async function handleAck(req: Request, pattern: string, name: string, messenger: Messenger): Promise<Response> {
  const raw = await readBody(req, 64 * 1024);
  let body: { seq?: unknown; channel?: unknown };
  try {
    body = JSON.parse(new TextDecoder().decode(raw));
  } catch {
    throw new BadRequestError('body must be JSON like {"seq": 42}');
  }
  if (body === null || typeof body !== "object") throw new BadRequestError('body must be JSON like {"seq": 42}');
  if (typeof body.seq !== "number" || !Number.isInteger(body.seq) || body.seq < 0) throw new BadRequestError('"seq" must be a non-negative integer');
  const sub = isWildcard(pattern) ? messenger.openSubscriber(pattern, name, { create: false }) : messenger.resolveSubscriber(pattern, name);
  const channel = ackChannel(sub, body.channel, pattern);
  const group = messenger.queues.get(sub.pattern, sub.name);
  if (!group) return json(200, { subscriber: name, pattern: sub.pattern, channel, cursor: sub.ack(channel, body.seq) });
  // A queue group's messages are acked one by one: the cursor moves past every acked prefix.
  const end = sub.nextSeqOf(channel) ?? 0;
  if (body.seq >= end) throw new InvalidArgumentError(`seq ${body.seq} is past the end of channel ${channel} (next seq ${end})`);
  const acked = group.ackSeq(channel, body.seq);
  return json(200, { subscriber: name, pattern: sub.pattern, channel, cursor: sub.cursorOf(channel), acked });
}

/** DELETE subscriber. */
export async function handleDeleteSubscriber(pattern: string, name: string, messenger: Messenger): Promise<Response> {
  if (!(await messenger.deleteSubscriber(pattern, name))) throw new UnknownSubscriberError(`no subscriber "${name}" on ${pattern}`);
  return json(200, { deleted: true, subscriber: name, pattern });
}
