/**
 * `keyop reload`: asks the running agent, through its API socket, to read
 * its configuration again (what SIGHUP does), and says what it applied.
 */
import { ApiError, LocalClient } from "../client/local-client.ts";
import { parseArgs } from "./args.ts";

export const RELOAD_USAGE = `usage: keyop reload [--socket PATH]

Makes the running agent read its configuration file again and apply what
can change while it runs: hub.peers, links, mqtt.users, storage.retention,
channels, log.level and the TLS certificates. Sessions the change does not
touch keep running. Prints what was applied and what needs a restart. A
file with any problem changes nothing: every problem is printed and the
exit code is 1.`;

export async function cmdReload(argv: string[]): Promise<number> {
  const p = parseArgs(argv, { socket: "string" }, 0);
  if (p.help) return (void console.log(RELOAD_USAGE), 0);
  const client = new LocalClient({ socket: p.flags.socket as string | undefined });
  try {
    const r = await client.call<{ applied: string[]; restart_needed: string[] }>("POST", "/v1/reload");
    console.log(r.applied.length === 0 ? "reloaded: nothing changed" : `reloaded: ${r.applied.join("; ")}`);
    if (r.restart_needed.length > 0) console.log(`changed, applied at the next restart only: ${r.restart_needed.join(", ")}`);
    return 0;
  } catch (err) {
    if (err instanceof ApiError && err.code === "invalid_config") {
      process.stderr.write(`keyop reload: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
}
