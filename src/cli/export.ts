/**
 * `keyop export`: a channel's (or a pattern's channels') messages, read
 * straight from the segment files, to stdout as NDJSON envelopes or a
 * stream of msgpack maps. It works with the agent running or stopped: it
 * takes no lock, writes nothing and moves no cursor.
 */
import { join } from "node:path";
import { Packr } from "msgpackr";
import { loadConfig } from "../config/schema.ts";
import { decodeEnvelope, type Message, toWire } from "../envelope/envelope.ts";
import { envelopeJson } from "../envelope/json.ts";
import { assertPattern, channelProblem, compilePattern } from "../envelope/names.ts";
import { readLogRecords, type ReadReport } from "../store/log-reader.ts";
import { readdir } from "node:fs/promises";
import { parseArgs, UsageError } from "./args.ts";

export const EXPORT_USAGE = `usage: keyop export CHANNEL|PATTERN [--from SEQ|TIME] [--to SEQ|TIME] [--format ndjson|msgpack] [--data-dir DIR | --config FILE]

Writes the messages of CHANNEL (or of every channel PATTERN matches, one
after another in name order) to stdout, read from the log files under the
data directory: NDJSON, one envelope per line as the API shows them
(default), or msgpack, one map per message. Works while the agent runs or
when it is stopped; reads only, moves no cursor. --from and --to bound the
messages by seq (a number, per channel) or by publish time (ISO 8601, such
as 2026-12-01T10:00:00Z), both ends included. Long exports print their
progress on stderr. "keyop import" stores them back.`;

type Bound = { seq: number } | { ts: number } | undefined;

function bound(v: unknown, flag: string): Bound {
  if (v === undefined) return undefined;
  const s = String(v);
  if (/^\d+$/.test(s)) return { seq: Number(s) };
  const ts = Date.parse(s);
  if (Number.isNaN(ts)) throw new UsageError(`${flag} ${JSON.stringify(s)} is neither a seq nor a time such as 2026-12-01T10:00:00Z`);
  return { ts };
}

/** The channels under `dataDir` that `pattern` matches, in name order. */
async function channelsOf(dataDir: string, pattern: string): Promise<string[]> {
  let names: string[];
  try {
    names = await readdir(join(dataDir, "channels"));
  } catch {
    return [];
  }
  const match = compilePattern(pattern);
  return names.filter((n) => channelProblem(n) === null && match(n)).sort();
}

export async function cmdExport(argv: string[]): Promise<number> {
  const p = parseArgs(argv, { from: "string", to: "string", format: "string", "data-dir": "string", config: "string" }, 1);
  if (p.help) return (void console.log(EXPORT_USAGE), 0);
  const target = p.positionals[0];
  if (!target) throw new UsageError("CHANNEL or PATTERN is required");
  try {
    assertPattern(target);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const format = (p.flags.format as string | undefined) ?? "ndjson";
  if (format !== "ndjson" && format !== "msgpack") throw new UsageError(`--format ${JSON.stringify(format)}: ndjson or msgpack`);
  const from = bound(p.flags.from, "--from");
  const to = bound(p.flags.to, "--to");
  const cfg = await loadConfig(p.flags.config as string | undefined, { dataDir: p.flags["data-dir"] as string | undefined });
  const dataDir = cfg.storage.dataDir;
  const channels = await channelsOf(dataDir, target);
  if (channels.length === 0) {
    process.stderr.write(`keyop export: no channel ${target} under ${dataDir}\n`);
    return 1;
  }
  const packr = new Packr({ useRecords: false, moreTypes: false, encodeUndefinedAsNil: true });
  const out = Bun.stdout.writer();
  const report: ReadReport = { damaged: 0, damagedBytes: 0 };
  const started = performance.now();
  let lastProgress = started;
  let n = 0;
  const progress = (channel: string, seq: number, final = false) => {
    const now = performance.now();
    if (!final && now - lastProgress < 1000) return;
    lastProgress = now;
    // Only exports that take a while say how they are going; the final line then too.
    if (now - started < 1000) return;
    process.stderr.write(`keyop export: ${n} messages, at ${channel} seq ${seq}, ${((now - started) / 1000).toFixed(1)} s${final ? "\n" : "\r"}`);
  };
  let channel = channels[0]!;
  let seq = 0;
  for (channel of channels) {
    const range = { from: from && "seq" in from ? from.seq : undefined, to: to && "seq" in to ? to.seq : undefined };
    for await (const r of readLogRecords(join(dataDir, "channels", channel), range, report)) {
      seq = r.seq;
      let m: Message;
      try {
        m = decodeEnvelope(r.body, r.seq);
      } catch {
        report.damaged++;
        continue;
      }
      if (from && "ts" in from && m.ts < from.ts) continue;
      if (to && "ts" in to && m.ts > to.ts) continue;
      if (format === "ndjson") out.write(envelopeJson(m) + "\n");
      else out.write(packr.pack(toWire(m)));
      n++;
      if ((n & 1023) === 0) {
        await out.flush();
        progress(channel, seq);
      }
    }
    progress(channel, seq);
  }
  progress(channel, seq, true);
  await out.flush();
  if (report.damaged > 0) process.stderr.write(`keyop export: skipped ${report.damaged} damaged records (${report.damagedBytes} bytes)\n`);
  return 0;
}
