/**
 * The agent's `/metrics`: a messenger's counters, gauges and latency
 * histograms, then whatever gauges the agent adds (connections, links ...).
 */
import type { Messenger, MessengerStats } from "../messenger/messenger.ts";
import { type ExtraGauges, Exposition, type Sample } from "../observability/metrics.ts";

type ChannelStats = MessengerStats["channels"][number];

const COUNTERS: [keyof ChannelStats, string, string][] = [
  ["published", "keyop_messages_published_total", "Messages published into the channel since start."],
  ["delivered", "keyop_messages_delivered_total", "Messages handed to subscribers (handlers, pulls, streams) since start."],
  ["acked", "keyop_messages_acked_total", "Messages acknowledged by subscribers since start."],
  ["redelivered", "keyop_messages_redelivered_total", "Messages delivered again after an earlier delivery was not acknowledged."],
  ["deadLettered", "keyop_messages_dead_lettered_total", "Messages moved to the dead-letter channel after failing every retry."],
  ["failed", "keyop_handler_failures_total", "Handler calls that failed (each retry counts)."],
  ["expired", "keyop_messages_expired_total", "Messages that had expired when a subscriber or link came to them (once per subscriber), since start."],
  ["rejected", "keyop_messages_rejected_total", "Publishes refused because the channel was full (full_policy reject), since start."],
  ["superseded", "keyop_messages_superseded_total", "Messages a link passed over for a newer one of the channel (full_policy latest), since start."],
];

const DISK: [string, string, (c: ChannelStats) => number][] = [
  ["keyop_log_fsync_failures_total", "fdatasyncs of the channel's log that failed since start (each answered by a reseal).", (c) => c.disk.failedSyncs],
  ["keyop_log_reseals_total", "Times the channel's log went back to its durable end and went on in a fresh segment.", (c) => c.disk.reseals],
  ["keyop_log_damaged_records_total", "Records lost to damage in the middle of a segment, found since start (the records after it are kept).", (c) => c.disk.damagedRecords],
  ["keyop_log_lost_records_total", "Committed records (sync: interval) that could not be carried over after a failed fdatasync.", (c) => c.disk.lostRecords],
];

/** The whole exposition as text. */
export function renderMetrics(m: Messenger, extra: ExtraGauges = {}): string {
  const st = m.stats();
  const e = new Exposition();
  const perChannel = (value: (c: ChannelStats) => number): Sample[] => st.channels.map((c) => ({ labels: { channel: c.channel }, value: value(c) }));
  for (const [key, name, help] of COUNTERS)
    e.counter(
      name,
      help,
      perChannel((c) => c[key] as number),
    );
  for (const [name, help, value] of DISK) e.counter(name, help, perChannel(value));
  e.gauge(
    "keyop_log_writable",
    "1 while the channel's log takes appends, 0 while it refuses them (its disk failed).",
    perChannel((c) => (c.disk.state === "ok" ? 1 : 0)),
  );
  e.counter("keyop_cursor_write_failures_total", "Cursor file writes that failed since start (each retried).", [{ value: st.cursors.failedWrites }]);
  e.gauge(
    "keyop_channel_bytes",
    "Bytes of stored records.",
    perChannel((c) => c.bytes),
  );
  e.gauge(
    "keyop_channel_messages",
    "Messages stored (next seq minus first seq).",
    perChannel((c) => c.messages),
  );
  e.gauge(
    "keyop_subscriber_lag",
    "Messages stored and not yet acknowledged by the subscriber.",
    st.channels.flatMap((c) => c.subscribers.map((s) => ({ labels: { channel: c.channel, subscriber: s.name, pattern: s.pattern }, value: s.lag }))),
  );
  const h = m.histograms();
  e.histogram("keyop_fsync_duration_seconds", "Duration of each fdatasync of a channel log.", h.fsync);
  e.histogram("keyop_publish_duration_seconds", "Time from publish to durable acknowledgement.", h.publishToDisk);
  e.histogram("keyop_delivery_latency_seconds", "Time from publish to handler call (in-process subscribers).", h.publishToHandler);
  return e.gauges(extra).text();
}
