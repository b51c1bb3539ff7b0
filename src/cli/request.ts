/**
 * `keyop request CHANNEL [JSON]`: sends a request and prints the reply's
 * envelope (one JSON line); exits 1 with the error's code when there is
 * none (`no_responders`, `timeout`).
 */
import { ApiError, LocalClient } from "../client/local-client.ts";
import { parseDuration } from "../config/units.ts";
import { envelopeJson } from "../envelope/json.ts";
import { parseArgs, UsageError } from "./args.ts";

/** Usage text of `keyop request`. */
export const REQUEST_USAGE = `usage: keyop request CHANNEL [JSON] [--type T] [--timeout DURATION] [--durable] [--correlation-id ID] [--socket PATH]

Sends the JSON payload (null when omitted) as a request and prints the
reply's envelope. --timeout (default 5s) is how long to wait; the request
expires then too. Without --durable it fails at once (no_responders) when
nobody is attached to the channel; with it the request is stored for a
responder that comes later (a board that is offline). --type defaults to
"json".`;

export async function cmdRequest(argv: string[]): Promise<number> {
  const p = parseArgs(argv, { type: "string", timeout: "string", durable: "boolean", "correlation-id": "string", socket: "string" }, 2);
  if (p.help) {
    console.log(REQUEST_USAGE);
    return 0;
  }
  const [channel, data] = p.positionals;
  if (!channel) throw new UsageError("CHANNEL is required");
  let payload: unknown = null;
  if (data !== undefined) {
    try {
      payload = JSON.parse(data);
    } catch (err) {
      throw new UsageError(`payload is not valid JSON: ${err instanceof Error ? err.message : String(err)}`);
    }
  }
  let timeoutMs = 5000;
  if (p.flags.timeout !== undefined) {
    const ms = parseDuration(p.flags.timeout);
    if (ms === null || ms < 1) throw new UsageError(`--timeout ${JSON.stringify(p.flags.timeout)} is not a duration such as 500ms, 5s or 1m`);
    timeoutMs = Math.round(ms);
  }
  const client = new LocalClient({ socket: p.flags.socket as string | undefined });
  try {
    const reply = await client.request(channel, (p.flags.type as string | undefined) ?? "json", payload, {
      timeoutMs,
      durable: p.flags.durable === true,
      ...(p.flags["correlation-id"] ? { correlationId: p.flags["correlation-id"] as string } : {}),
    });
    console.log(envelopeJson(reply));
    return 0;
  } catch (err) {
    // The code first, so that a script can tell no_responders from timeout.
    if (!(err instanceof ApiError)) throw err;
    process.stderr.write(`keyop request: ${err.code}: ${err.message}\n`);
    return 1;
  }
}
