/**
 * Prometheus text exposition (format 0.0.4) of a messenger's counters,
 * gauges and latency histograms, plus whatever gauges the agent adds.
 */
import type { Messenger } from "../messenger/messenger.ts";
import type { Histogram } from "./histogram.ts";

/** One gauge sample. */
export interface GaugeSample {
  help: string;
  value: number;
  labels?: Record<string, string>;
}

/** Extra gauges supplied by the agent (connections, uptime, links ...): one sample or a labelled family. */
export type ExtraGauges = Record<string, GaugeSample | GaugeSample[]>;

/** Histogram bucket upper bounds in seconds. */
const BUCKETS_S = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];

function esc(v: string): string {
  return v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}

function labels(l: Record<string, string> | undefined): string {
  if (!l) return "";
  const parts = Object.entries(l).map(([k, v]) => `${k}="${esc(v)}"`);
  return parts.length ? `{${parts.join(",")}}` : "";
}

function histogram(out: string[], name: string, help: string, h: Histogram): void {
  out.push(`# HELP ${name} ${help}`, `# TYPE ${name} histogram`);
  for (const b of h.cumulative(BUCKETS_S.map((s) => s * 1000))) out.push(`${name}_bucket{le="${b.le / 1000}"} ${b.count}`);
  out.push(`${name}_bucket{le="+Inf"} ${h.count}`, `${name}_sum ${h.total / 1000}`, `${name}_count ${h.count}`);
}

/** The whole exposition as text. */
export function renderMetrics(m: Messenger, extra: ExtraGauges = {}): string {
  const st = m.stats();
  const out: string[] = [];
  const counters: [keyof (typeof st.channels)[number], string, string][] = [
    ["published", "keyop_messages_published_total", "Messages published into the channel since start."],
    ["delivered", "keyop_messages_delivered_total", "Messages handed to subscribers (handlers, pulls, streams) since start."],
    ["acked", "keyop_messages_acked_total", "Messages acknowledged by subscribers since start."],
    ["redelivered", "keyop_messages_redelivered_total", "Messages delivered again after an earlier delivery was not acknowledged."],
    ["deadLettered", "keyop_messages_dead_lettered_total", "Messages moved to the dead-letter channel after failing every retry."],
    ["failed", "keyop_handler_failures_total", "Handler calls that failed (each retry counts)."],
  ];
  for (const [key, name, help] of counters) {
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} counter`);
    for (const c of st.channels) out.push(`${name}{channel="${esc(c.channel)}"} ${c[key] as number}`);
  }
  const disk: [string, string, (c: (typeof st.channels)[number]) => number][] = [
    ["keyop_log_fsync_failures_total", "fdatasyncs of the channel's log that failed since start (each answered by a reseal).", (c) => c.disk.failedSyncs],
    ["keyop_log_reseals_total", "Times the channel's log went back to its durable end and went on in a fresh segment.", (c) => c.disk.reseals],
    ["keyop_log_damaged_records_total", "Records lost to damage in the middle of a segment, found since start (the records after it are kept).", (c) => c.disk.damagedRecords],
    ["keyop_log_lost_records_total", "Committed records (sync: interval) that could not be read back after a failed fdatasync.", (c) => c.disk.lostRecords],
  ];
  for (const [name, help, value] of disk) {
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} counter`);
    for (const c of st.channels) out.push(`${name}{channel="${esc(c.channel)}"} ${value(c)}`);
  }
  out.push("# HELP keyop_log_writable 1 while the channel's log takes appends, 0 while it refuses them (its disk failed).", "# TYPE keyop_log_writable gauge");
  for (const c of st.channels) out.push(`keyop_log_writable{channel="${esc(c.channel)}"} ${c.disk.state === "ok" ? 1 : 0}`);
  out.push("# HELP keyop_cursor_write_failures_total Cursor file writes that failed since start (each retried).", "# TYPE keyop_cursor_write_failures_total counter");
  out.push(`keyop_cursor_write_failures_total ${st.cursors.failedWrites}`);
  out.push("# HELP keyop_channel_bytes Bytes of stored records.", "# TYPE keyop_channel_bytes gauge");
  for (const c of st.channels) out.push(`keyop_channel_bytes{channel="${esc(c.channel)}"} ${c.bytes}`);
  out.push("# HELP keyop_channel_messages Messages stored (next seq minus first seq).", "# TYPE keyop_channel_messages gauge");
  for (const c of st.channels) out.push(`keyop_channel_messages{channel="${esc(c.channel)}"} ${c.messages}`);
  out.push("# HELP keyop_subscriber_lag Messages stored and not yet acknowledged by the subscriber.", "# TYPE keyop_subscriber_lag gauge");
  for (const c of st.channels) {
    for (const s of c.subscribers) out.push(`keyop_subscriber_lag${labels({ channel: c.channel, subscriber: s.name, pattern: s.pattern })} ${s.lag}`);
  }
  const h = m.histograms();
  histogram(out, "keyop_fsync_duration_seconds", "Duration of each fdatasync of a channel log.", h.fsync);
  histogram(out, "keyop_publish_duration_seconds", "Time from publish to durable acknowledgement.", h.publishToDisk);
  histogram(out, "keyop_delivery_latency_seconds", "Time from publish to handler call (in-process subscribers).", h.publishToHandler);
  for (const [name, g] of Object.entries(extra)) {
    const samples = Array.isArray(g) ? g : [g];
    if (samples.length === 0) continue;
    out.push(`# HELP ${name} ${samples[0]!.help}`, `# TYPE ${name} gauge`);
    for (const x of samples) out.push(`${name}${labels(x.labels)} ${x.value}`);
  }
  return out.join("\n") + "\n";
}
