/**
 * `keyop pull`: one pull of a durable subscriber; prints the envelopes and
 * acks them (cumulatively, per channel) unless --no-ack.
 */
import { envelopeJson } from "../envelope/json.ts";
import { isWildcard } from "../envelope/names.ts";
import { LocalClient } from "../client/local-client.ts";
import { fromFlag, intFlag, parseArgs, UsageError } from "./args.ts";

/** Usage text of `keyop pull`. */
export const PULL_USAGE = `usage: keyop pull CHANNEL --name NAME [--from earliest|latest|SEQ] [--max N] [--wait SECONDS] [--no-ack] [--socket PATH]

Prints up to N (default 100) messages after the subscriber's cursor, one
envelope JSON per line, waiting up to SECONDS for the first, then acks them.
With --no-ack they come again on the next pull. A new subscriber starts at
--from (default latest: only what is published after its first pull).`;

/** Pulls once; resolves with the exit code. */
export async function cmdPull(argv: string[]): Promise<number> {
  const p = parseArgs(argv, { name: "string", from: "string", max: "string", wait: "string", "no-ack": "boolean", socket: "string" }, 1);
  if (p.help) {
    console.log(PULL_USAGE);
    return 0;
  }
  const channel = p.positionals[0];
  if (!channel) throw new UsageError("CHANNEL is required");
  const name = p.flags.name as string | undefined;
  if (!name) throw new UsageError("--name is required");
  const max = intFlag(p, "max", 100);
  const from = fromFlag(p);
  const waitS = p.flags.wait as string | undefined;
  if (waitS !== undefined && !/^\d+(\.\d+)?$/.test(waitS)) throw new UsageError("--wait must be a number of seconds");
  const client = new LocalClient({ socket: p.flags.socket as string | undefined });
  const msgs = await client.pull(channel, name, { max, from, waitMs: waitS === undefined ? 0 : Number(waitS) * 1000 });
  if (msgs.length > 0) process.stdout.write(msgs.map(envelopeJson).join("\n") + "\n");
  // The usual first surprise: a new name starts after everything already published.
  else if (from === undefined) console.error(`no messages after the cursor of ${name}; a new subscriber starts at latest (--from earliest reads ${channel} from its start)`);
  if (!p.flags["no-ack"]) {
    const last = new Map<string, number>();
    for (const m of msgs) last.set(m.channel, m.seq);
    for (const [ch, seq] of last) await client.ack(channel, name, seq, isWildcard(channel) ? ch : undefined);
  }
  return 0;
}
