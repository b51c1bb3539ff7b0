/**
 * The QoS 1 and 2 messages one MQTT session has sent its client and not
 * yet completed: their packet ids, the QoS 2 handshake (PUBREC moves the
 * cursor, PUBCOMP ends it), and the room in the session's window each
 * holds. Pure state: the session sends the packets and saves what a
 * persistent session owes.
 */
import type { Window } from "../messenger/window.ts";
import type { DeliverySource, SentFrom } from "./subscription.ts";

/** A message in flight to the client. */
export interface InFlight {
  /** The source and its reader's delivery it came from; null for a retained message sent on subscribe, or once released. */
  from: SentFrom | null;
  channel: string;
  seq: number;
  qos: 1 | 2;
  /** QoS 2: the client sent PUBREC, PUBREL went out, and PUBCOMP is awaited. */
  released: boolean;
  /**
   * The message holds a unit of the window itself (retained messages, a
   * shared group's, a PUBREL owed), given back when it is done; otherwise
   * its subscription's reader holds it.
   */
  ownsRoom: boolean;
}

/** What a PUBREC means for the session. */
export type PubrecResult = "unknown" | "refused" | "released" | "again";

export class Outbound {
  private readonly inflight = new Map<number, InFlight>();
  private nextId = 1;

  constructor(private readonly window: Window) {}

  /** A free packet id for `f`, now in flight. */
  take(f: InFlight): number {
    let id = this.nextId;
    while (this.inflight.has(id)) id = (id % 65_535) + 1;
    this.nextId = (id % 65_535) + 1;
    this.inflight.set(id, f);
    return id;
  }

  /** A PUBREL owed from an earlier connection of a persistent session: it holds room until PUBCOMP. */
  owe(id: number): void {
    this.inflight.set(id, { from: null, channel: "", seq: -1, qos: 2, released: true, ownsRoom: true });
    this.window.take(0);
  }

  /** PUBACK: the QoS 1 message is done. False for an id that is not one in flight. */
  puback(id: number): boolean {
    const f = this.inflight.get(id);
    if (f?.qos !== 1) return false;
    this.inflight.delete(id);
    this.done(f);
    return true;
  }

  /**
   * PUBREC: the client has the QoS 2 message, so its cursor moves now and
   * only the packet id stays until PUBCOMP, keeping its room in the window.
   * "unknown": no such QoS 2 message; "refused": the client refused it
   * (a reason of 0x80 or more), done; "released": PUBREL is to be sent
   * (and, for a persistent session, saved); "again": a repeated PUBREC.
   */
  pubrec(id: number, reason: number): PubrecResult {
    const f = this.inflight.get(id);
    if (f?.qos !== 2) return "unknown";
    if (reason >= 0x80) {
      this.inflight.delete(id);
      this.done(f);
      return "refused";
    }
    if (f.released) return "again";
    f.released = true;
    if (f.from) f.from.subscription.acked(f.from.delivery);
    if (!f.ownsRoom) this.window.take(0);
    f.ownsRoom = true;
    f.from = null;
    return "released";
  }

  /** PUBCOMP: the QoS 2 handshake is over. False for an id not awaiting one. */
  pubcomp(id: number): boolean {
    const f = this.inflight.get(id);
    if (!f?.released) return false;
    this.inflight.delete(id);
    this.window.give(0);
    return true;
  }

  /** Hands every unacknowledged message of `source` (all sources: undefined) to `give`, and forgets it. */
  returnTo(source: DeliverySource | undefined, give: (f: InFlight & { from: SentFrom }) => void): void {
    for (const [id, f] of this.inflight) {
      if (!f.from || f.released || (source && f.from.subscription !== source)) continue;
      this.inflight.delete(id);
      if (f.ownsRoom) this.window.give(0);
      give(f as InFlight & { from: SentFrom });
    }
  }

  /** Forgets everything (the connection is gone: what was not acknowledged comes again from the cursors). */
  clear(): void {
    this.inflight.clear();
  }

  /** The message of `f` is done: its source's cursor may move, and its room in the window is given back. */
  private done(f: InFlight): void {
    if (f.from) f.from.subscription.acked(f.from.delivery);
    if (f.ownsRoom) this.window.give(0);
  }
}
