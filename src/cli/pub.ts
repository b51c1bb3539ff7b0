/**
 * `keyop pub CHANNEL [JSON|-]`: publish one JSON payload, or with `-` one
 * payload per stdin line (sent in batches); prints one receipt per message.
 */
import { LocalClient } from "../client/local-client.ts";
import { parseArgs, UsageError } from "./args.ts";
import { parseDuration } from "../config/units.ts";

/** Usage text of `keyop pub`. */
export const PUB_USAGE = `usage: keyop pub CHANNEL [JSON|-] [--type T] [--correlation-id ID] [--service NAME] [--ttl DURATION] [--socket PATH]

Publishes the JSON payload (null when omitted) and prints the receipt
{"id","channel","seq","ts"} once the agent has stored it durably. With "-",
every line of stdin is one JSON payload. --type defaults to "json".
--ttl (e.g. 30s, 5m, 2h): after it the message is neither delivered nor
forwarded.`;

const BATCH = 500;

/** Publishes; resolves with the exit code. */
export async function cmdPub(argv: string[]): Promise<number> {
  const p = parseArgs(argv, { type: "string", "correlation-id": "string", service: "string", ttl: "string", socket: "string" }, 2);
  if (p.help) {
    console.log(PUB_USAGE);
    return 0;
  }
  const [channel, data] = p.positionals;
  if (!channel) throw new UsageError("CHANNEL is required");
  const client = new LocalClient({ socket: p.flags.socket as string | undefined });
  const type = (p.flags.type as string | undefined) ?? "json";
  const opts = {
    ...(p.flags["correlation-id"] ? { correlationId: p.flags["correlation-id"] as string } : {}),
    ...(p.flags.service ? { serviceName: p.flags.service as string } : {}),
    ...(p.flags.ttl !== undefined ? { ttlMs: ttlOf(p.flags.ttl as string) } : {}),
  };
  if (data !== "-") {
    const payload = data === undefined ? null : parseJson(data, "payload");
    console.log(JSON.stringify(await client.publish(channel, type, payload, opts)));
    return 0;
  }
  let batch: unknown[] = [];
  let lineNo = 0;
  const flush = async () => {
    if (batch.length === 0) return;
    const receipts = await client.publishBatch(
      channel,
      batch.map((payload) => ({ type, payload, ...opts })),
    );
    process.stdout.write(receipts.map((r) => JSON.stringify(r)).join("\n") + "\n");
    batch = [];
  };
  const dec = new TextDecoder();
  let rest = "";
  for await (const chunk of Bun.stdin.stream() as unknown as AsyncIterable<Uint8Array>) {
    rest += dec.decode(chunk, { stream: true });
    for (let nl = rest.indexOf("\n"); nl >= 0; nl = rest.indexOf("\n")) {
      const line = rest.slice(0, nl);
      rest = rest.slice(nl + 1);
      lineNo++;
      if (line.trim() === "") continue;
      batch.push(parseJson(line, `stdin line ${lineNo}`));
      if (batch.length >= BATCH) await flush();
    }
  }
  if (rest.trim() !== "") batch.push(parseJson(rest, `stdin line ${lineNo + 1}`));
  await flush();
  return 0;
}

function ttlOf(v: string): number {
  const ms = parseDuration(v);
  if (ms === null || ms < 1) throw new UsageError(`--ttl ${JSON.stringify(v)} is not a duration such as 30s, 5m or 2h`);
  return Math.round(ms);
}

function parseJson(s: string, what: string): unknown {
  try {
    return JSON.parse(s);
  } catch (err) {
    throw new UsageError(`${what} is not valid JSON: ${err instanceof Error ? err.message : String(err)}`);
  }
}
