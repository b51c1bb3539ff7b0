/**
 * How federation appears in `/v1/status` and `/metrics`: the JSON of each
 * link and hub peer, and the gauges for them. Federation reports plain
 * facts (LinkInfo); their public shape is decided here, beside the rest of
 * the agent's status.
 */
import type { LinkInfo } from "../federation/link.ts";
import type { ExtraGauges, GaugeSample } from "../observability/metrics.ts";

/** One link or peer as `/v1/status` shows it (snake_case, times as ISO strings). */
export function linkJson(l: LinkInfo): Record<string, unknown> {
  return {
    kind: l.kind,
    target: l.target,
    state: l.state,
    peer: l.peer,
    connected_since: l.connectedSince === null ? null : new Date(l.connectedSince).toISOString(),
    reconnects: l.reconnects,
    rtt_ms: l.rttMs,
    unacked_batches: l.unackedBatches,
    stored: l.stored,
    backlog: l.backlog.map((b) => ({ channel: b.channel, messages: b.messages, bytes: b.bytes, oldest_age_ms: b.oldestAgeMs ?? null })),
    lane_backlog: l.laneBacklog.map((x) => ({ priority: x.priority, messages: x.messages, oldest_age_ms: x.oldestAgeMs })),
    stalls: l.stalls,
    last_error: l.lastError,
    compression: l.compression,
    max_bytes_per_s: l.maxBytesPerS,
    wire_bytes: l.wire && { sent_raw: l.wire.sentRaw, sent_wire: l.wire.sentWire, received_raw: l.wire.receivedRaw, received_wire: l.wire.receivedWire },
    lanes: l.lanes.map((x) => ({ priority: x.priority, queued_frames: x.queuedFrames, queued_bytes: x.queuedBytes, sent_frames: x.sentFrames, sent_bytes: x.sentBytes })),
  };
}

/** Gauges for /metrics: link state, reconnects, RTT and backlog per peer and channel, and the audit trail's health. */
export function federationGauges(links: LinkInfo[], audit: { failedWrites: number; droppedLines: number } | undefined): ExtraGauges {
  const up: GaugeSample[] = [];
  const reconnects: GaugeSample[] = [];
  const rtt: GaugeSample[] = [];
  const backlog: GaugeSample[] = [];
  const backlogBytes: GaugeSample[] = [];
  const wire: GaugeSample[] = [];
  const laneBytes: GaugeSample[] = [];
  const oldest: GaugeSample[] = [];
  const stalls: GaugeSample[] = [];
  for (const l of links) {
    const labels = { kind: l.kind, target: l.target };
    up.push({ help: "1 when the link or peer session is open.", value: l.state === "open" ? 1 : 0, labels });
    if (l.kind === "link") reconnects.push({ help: "Times the link has reconnected since start.", value: l.reconnects, labels });
    if (l.rttMs !== null) rtt.push({ help: "Last heartbeat round trip of the session, seconds.", value: l.rttMs / 1000, labels });
    for (const b of l.backlog) {
      const where = { ...labels, peer: l.peer ?? "", channel: b.channel };
      backlog.push({ help: "Messages stored here and not yet acknowledged by the peer.", value: b.messages, labels: where });
      backlogBytes.push({ help: "Record bytes stored here and not yet acknowledged by the peer (to within 4 KiB).", value: b.bytes, labels: where });
    }
    if (l.wire) {
      const help = "BATCH bytes of the open session: as encoded (stage raw) and on the wire after compression (stage wire).";
      const peer = l.peer ?? "";
      wire.push({ help, value: l.wire.sentRaw, labels: { ...labels, peer, direction: "sent", stage: "raw" } });
      wire.push({ help, value: l.wire.sentWire, labels: { ...labels, peer, direction: "sent", stage: "wire" } });
      wire.push({ help, value: l.wire.receivedRaw, labels: { ...labels, peer, direction: "received", stage: "raw" } });
      wire.push({ help, value: l.wire.receivedWire, labels: { ...labels, peer, direction: "received", stage: "wire" } });
    }
    stalls.push({ help: "Sessions the stall watchdog ended since start (nothing acknowledged although the link looked alive).", value: l.stalls, labels });
    for (const x of l.laneBacklog) {
      if (x.oldestAgeMs === null) continue;
      oldest.push({
        help: "Age of the oldest message the peer has not acknowledged, per priority lane, seconds.",
        value: x.oldestAgeMs / 1000,
        labels: { ...labels, peer: l.peer ?? "", priority: String(x.priority) },
      });
    }
    for (const x of l.lanes) {
      laneBytes.push({ help: "Wire bytes of data sent in each priority lane of the open session.", value: x.sentBytes, labels: { ...labels, peer: l.peer ?? "", priority: String(x.priority) } });
    }
  }
  return {
    keyop_link_up: up,
    keyop_link_reconnects: reconnects,
    keyop_link_rtt_seconds: rtt,
    keyop_federation_backlog_messages: backlog,
    keyop_federation_backlog_bytes: backlogBytes,
    keyop_federation_batch_bytes: wire,
    keyop_federation_lane_sent_bytes: laneBytes,
    keyop_federation_oldest_unacked_seconds: oldest,
    keyop_link_stalls: stalls,
    ...(audit
      ? {
          keyop_audit_write_failures: [{ help: "Audit trail appends that failed since start (each retried, lines kept).", value: audit.failedWrites }],
          keyop_audit_dropped_lines: [{ help: "Audit lines dropped since start because the queue was full.", value: audit.droppedLines }],
        }
      : {}),
  };
}

/** A hub tier's engine as `/v1/status` shows it. */
export function jetstreamJson(e: {
  state: string;
  why: string;
  stats: { stored: number; duplicates: number; retries: number; expired: number; catchUps: number; live: number };
}): Record<string, unknown> {
  const s = e.stats;
  return { state: e.state, reason: e.why || null, stored: s.stored, duplicates: s.duplicates, retries: s.retries, expired: s.expired, catch_ups: s.catchUps, live: s.live };
}

/** Gauges for a hub tier's JetStream engine: whether it takes writes, and what it did since start. */
export function jetstreamGauges(state: string, stats: { stored: number; duplicates: number; retries: number; expired: number }): ExtraGauges {
  return {
    keyop_jetstream_available: [{ help: "1 when the hub tier's JetStream cluster takes writes (sessions are refused otherwise).", value: state === "available" ? 1 : 0 }],
    keyop_jetstream_stored: [{ help: "Records stored in JetStream since start.", value: stats.stored }],
    keyop_jetstream_duplicates: [{ help: "Records JetStream already had (same id within the duplicate window), since start.", value: stats.duplicates }],
    keyop_jetstream_retries: [{ help: "Publishes sent again with the same id since start (leader elections, lost servers).", value: stats.retries }],
    keyop_jetstream_expired: [{ help: "Stream messages boards missed because their position was older than the stream's first message, since start.", value: stats.expired }],
  };
}
