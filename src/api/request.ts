/**
 * `POST /v1/channels/{channel}/requests?timeout_ms=N[&durable=true]`: sends
 * one JSON message as a request and answers with the reply's envelope, or
 * with the error: 503 `no_responders` (nobody attached to answer), 504
 * `timeout`. A responder answers by publishing to the request's `reply_to`
 * with `correlation_id` set to the request's id (messenger.ts `reply`).
 */
import { toWire } from "../envelope/envelope.ts";
import type { Messenger } from "../messenger/messenger.ts";
import { boolParam, intParam, json } from "./http.ts";
import { type PublishLimits, singleMessage } from "./publish.ts";

/** Longest a request over HTTP may wait for its reply. */
const MAX_TIMEOUT_MS = 300_000;

export async function handleRequest(req: Request, url: URL, channel: string, messenger: Messenger, limits: PublishLimits): Promise<Response> {
  const timeoutMs = intParam(url, "timeout_ms", 5000, 1, MAX_TIMEOUT_MS);
  const durable = boolParam(url, "durable");
  const entry = await singleMessage(req, channel, limits);
  const reply = await messenger.request(channel, entry.type, entry.payload, { ...entry.opts, timeoutMs, durable });
  return json(200, toWire(reply));
}
