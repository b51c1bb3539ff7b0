/** The outbound in-flight state of an MQTT session: packet ids, the QoS 2 handshake, the window's room. */
import { describe, expect, test } from "bun:test";
import { Window } from "../../src/messenger/window.ts";
import { Outbound } from "../../src/mqtt/outbound.ts";
import type { DeliverySource, SentFrom } from "../../src/mqtt/subscription.ts";

/** A source that counts acknowledgements, and holds one unit of the window per delivery as a reader does. */
function source(window: Window) {
  const acked: number[] = [];
  const src: DeliverySource = { durable: false, acked: (d) => (acked.push((d as { last: number }).last), window.give(0)) };
  const from = (seq: number): SentFrom => {
    window.take(0);
    return { subscription: src, delivery: { channel: "c", records: [], last: seq, bytes: 0 } };
  };
  return { src, acked, from };
}

describe("Outbound", () => {
  test("packet ids go round 1..65535, skipping those in flight", () => {
    const o = new Outbound(new Window(100));
    const f = { from: null, channel: "c", seq: 1, qos: 1 as const, released: false, ownsRoom: false };
    expect([o.take(f), o.take(f), o.take(f)]).toEqual([1, 2, 3]);
    expect(o.puback(2)).toBe(true);
    for (let i = 4; i <= 65_535; i++) o.take(f);
    expect(o.take(f)).toBe(2); // 1 and 3 are still in flight
    expect(o.puback(99_999)).toBe(false);
  });

  test("QoS 1: PUBACK acknowledges the source and gives the room back", () => {
    const w = new Window(2);
    const s = source(w);
    const o = new Outbound(w);
    const id = o.take({ from: s.from(7), channel: "c", seq: 7, qos: 1, released: false, ownsRoom: false });
    expect(w.room()).toBe(1);
    expect(o.pubrec(id, 0)).toBe("unknown"); // not a QoS 2 message
    expect(o.puback(id)).toBe(true);
    expect(s.acked).toEqual([7]);
    expect(w.room()).toBe(2);
  });

  test("QoS 2: PUBREC moves the cursor but keeps the room until PUBCOMP; a refusal ends it at once", () => {
    const w = new Window(2);
    const s = source(w);
    const o = new Outbound(w);
    const id = o.take({ from: s.from(3), channel: "c", seq: 3, qos: 2, released: false, ownsRoom: false });
    expect(o.puback(id)).toBe(false);
    expect(o.pubcomp(id)).toBe(false); // no PUBREC yet
    expect(o.pubrec(id, 0)).toBe("released");
    expect(s.acked).toEqual([3]);
    expect(w.room()).toBe(1);
    expect(o.pubrec(id, 0)).toBe("again");
    expect(o.pubcomp(id)).toBe(true);
    expect(w.room()).toBe(2);
    const refused = o.take({ from: s.from(4), channel: "c", seq: 4, qos: 2, released: false, ownsRoom: false });
    expect(o.pubrec(refused, 0x80)).toBe("refused");
    expect(s.acked).toEqual([3, 4]);
    expect(w.room()).toBe(2);
  });

  test("a PUBREL owed from an earlier connection holds room until PUBCOMP; returnTo hands back what a source had unacknowledged", () => {
    const w = new Window(3);
    const o = new Outbound(w);
    o.owe(9);
    expect(w.room()).toBe(2);
    expect(o.pubcomp(9)).toBe(true);
    expect(w.room()).toBe(3);
    const a = source(w);
    const b = source(w);
    w.take(0);
    o.take({ from: a.from(1), channel: "c", seq: 1, qos: 1, released: false, ownsRoom: true });
    o.take({ from: b.from(2), channel: "c", seq: 2, qos: 1, released: false, ownsRoom: false });
    const back: number[] = [];
    o.returnTo(a.src, (f) => back.push(f.seq));
    expect(back).toEqual([1]);
    expect(a.acked).toEqual([]); // handed back, not acknowledged
    o.returnTo(undefined, (f) => back.push(f.seq));
    expect(back).toEqual([1, 2]);
  });
});
