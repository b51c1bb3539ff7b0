/**
 * The hub tier of an agent whose hub has `hub.jetstream`: the engine stores
 * what peers send, and a StreamForwarder per session sends them what they
 * subscribe to from the streams.
 */
import { EngineUnavailableError } from "../errors.ts";
import type { HubTier } from "../federation/federation.ts";
import type { Logger } from "../observability/logger.ts";
import type { JetStreamEngine } from "./engine.ts";
import { planStreams, StreamForwarder } from "./stream-forwarder.ts";
import { inboxReplySubject } from "./subjects.ts";

/** The tier on `engine`; `name` is the instance name every hub of the tier shares. */
export function jetstreamTier(engine: JetStreamEngine, o: { name: string; window: number; maxBatchBytes: number; maxMessageBytes: number; logger: Logger }): HubTier {
  const cfg = engine.config;
  return {
    store: engine,
    sender: (session, s) => {
      const positions = s.volatile ? null : engine.positions;
      if (!s.volatile && !positions) throw new EngineUnavailableError("jetstream positions are not ready");
      return new StreamForwarder({
        source: engine,
        positions,
        session,
        tier: o.name,
        plans: planStreams(cfg.streams, s.patterns, cfg.subjectPrefix),
        allow: s.allow,
        start: s.volatile ? "latest" : s.start,
        prefix: cfg.subjectPrefix,
        window: o.window,
        maxBatchBytes: o.maxBatchBytes,
        maxMessageBytes: o.maxMessageBytes,
        logger: o.logger,
        audit: s.audit,
        onExpired: (n) => {
          engine.stats.expired += n;
        },
        laneOf: s.laneOf,
        maxBytesPerS: s.maxBytesPerS,
        onRequest: s.onRequest,
      });
    },
    reply: (inbox, body) => {
      const subject = inboxReplySubject(inbox);
      if (subject === null) return false;
      try {
        return engine.publishReply(subject, body);
      } catch (err) {
        o.logger.warn("a reply for a NATS requester was not sent", { subject, error: String(err) });
        return false;
      }
    },
  };
}
