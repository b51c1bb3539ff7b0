/**
 * Where a receiver stores the records it keeps: the agent's own log, or the
 * JetStream cluster of a hub tier (src/jetstream/sink.ts). One interface, so
 * the receiver's checks and its acknowledgement order are written once.
 */
import type { Messenger } from "../messenger/messenger.ts";

/** A record a receiver keeps: its message id and its stored bytes (this instance already in its route). */
export interface SinkRecord {
  id: string;
  body: Uint8Array;
}

/** Stores kept records. */
export interface RecordSink {
  /**
   * Stores `records`, all of `channel`, in order; resolves once they are
   * durable by the sink's standard (the log's sync mode, JetStream's
   * acknowledgement). A record stored before under the same id may be
   * dropped as a duplicate. Rejects with a `KeyopError` when not stored.
   */
  store(channel: string, records: readonly SinkRecord[]): Promise<void>;
  /**
   * `store`, done before it returns when it can be (a lone record into an
   * open local log): then undefined, the records as durable as `store`'s
   * promise would have meant. Otherwise the promise `store` gives. A sink
   * that never stores at once leaves it out.
   */
  storeNow?(channel: string, records: readonly SinkRecord[]): undefined | Promise<void>;
}

/** Where a hub stores what its peers send, when that is not its own log: it may be down. */
export interface HubStore extends RecordSink {
  /** Why records cannot be stored now (a hub then refuses sessions), or null when they can. */
  unavailable(): string | null;
}

const nothing = (): undefined => undefined;

/** The agent's own log. */
export function messengerSink(messenger: Messenger): RecordSink {
  const bodies = (records: readonly SinkRecord[]) => records.map((r) => r.body);
  return {
    store: async (channel, records) => {
      await messenger.ingest(channel, bodies(records));
    },
    storeNow: (channel, records) => {
      if (records.length !== 1) return messenger.ingest(channel, bodies(records)).then(nothing);
      const seq = messenger.ingestNow(channel, records[0]!.body);
      return typeof seq === "number" ? undefined : seq.then(nothing);
    },
  };
}
