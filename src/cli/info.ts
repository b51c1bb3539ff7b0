/**
 * `keyop channels`, `keyop status`, `keyop version`: what the agent holds
 * and how it is doing, for people (a table) or scripts (`--json`).
 */
import { LocalClient } from "../client/local-client.ts";
import { COMMIT, VERSION } from "../version.ts";
import { parseArgs } from "./args.ts";

/** Usage texts. */
export const CHANNELS_USAGE = "usage: keyop channels [--json] [--socket PATH]\n\nLists channels with first/next seq, size and each subscriber's cursor and lag.";
export const STATUS_USAGE = "usage: keyop status [--json] [--socket PATH]\n\nShows the agent's name, version, uptime, storage totals and links.";
export const VERSION_USAGE = "usage: keyop version\n\nPrints the version, the commit it was built from and the runtime.";

function table(rows: string[][]): string {
  const w = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return rows
    .map((r) =>
      r
        .map((c, i) => (i === 0 ? c.padEnd(w[i]!) : c.padStart(w[i]!)))
        .join("  ")
        .trimEnd(),
    )
    .join("\n");
}

/** `keyop channels`. */
export async function cmdChannels(argv: string[]): Promise<number> {
  const p = parseArgs(argv, { json: "boolean", socket: "string" }, 0);
  if (p.help) return (void console.log(CHANNELS_USAGE), 0);
  const { channels } = await new LocalClient({ socket: p.flags.socket as string | undefined }).channels();
  if (p.flags.json) return (void console.log(JSON.stringify({ channels }, null, 2)), 0);
  if (channels.length === 0) return (void console.log("no channels"), 0);
  const rows = [["CHANNEL", "FIRST", "NEXT", "MESSAGES", "BYTES", "SUBSCRIBERS (cursor/lag)"]];
  for (const c of channels) {
    const subs = (c.subscribers as { name: string; cursor: number; lag: number }[]).map((s) => `${s.name}@${s.cursor}/${s.lag}`).join(" ");
    rows.push([String(c.channel), String(c.first_seq), String(c.next_seq), String(c.messages), String(c.bytes), subs || "-"]);
  }
  console.log(table(rows));
  return 0;
}

function tlsLine(t: Record<string, unknown>): string {
  return `${t.name}, certificate expires ${t.cert_not_after} (${t.cert_days_left} days), CA ${t.ca} expires ${t.ca_not_after} (${t.ca_days_left} days)`;
}

/** `keyop status`. */
export async function cmdStatus(argv: string[]): Promise<number> {
  const p = parseArgs(argv, { json: "boolean", socket: "string" }, 0);
  if (p.help) return (void console.log(STATUS_USAGE), 0);
  const st = await new LocalClient({ socket: p.flags.socket as string | undefined }).status();
  if (p.flags.json) return (void console.log(JSON.stringify(st, null, 2)), 0);
  const s = st.storage as Record<string, number>;
  const lines = [
    `name:      ${st.name}`,
    `version:   ${st.version} (${st.commit})`,
    `pid:       ${st.pid}, up ${st.uptime_s} s since ${st.started_at}`,
    `data dir:  ${st.data_dir} (sync: ${st.sync})`,
    `storage:   ${s.channels} channels, ${s.messages} messages, ${s.bytes} bytes, ${s.subscribers} subscribers`,
    `tls:       ${st.tls ? tlsLine(st.tls as Record<string, unknown>) : "not configured"}`,
    `links:     ${(st.links as unknown[]).length === 0 ? "none" : JSON.stringify(st.links)}`,
  ];
  console.log(lines.join("\n"));
  return 0;
}

/** `keyop version`. */
export async function cmdVersion(argv: string[]): Promise<number> {
  const p = parseArgs(argv, {}, 0);
  if (p.help) return (void console.log(VERSION_USAGE), 0);
  console.log(`keyop ${VERSION} (commit ${COMMIT}, bun ${Bun.version}, ${process.platform}-${process.arch})`);
  return 0;
}
