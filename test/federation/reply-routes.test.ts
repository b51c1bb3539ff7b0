import { describe, expect, test } from "bun:test";
import { ReplyRoutes } from "../../src/federation/reply-routes.ts";

describe("ReplyRoutes", () => {
  test("a reply is taken only from the peer the request went to, before it expires", () => {
    const r = new ReplyRoutes();
    r.sent("_inbox.a", "board-7", 1000);
    expect(r.accepts("_inbox.a", "board-7", 500)).toBe(true);
    expect(r.accepts("_inbox.a", "board-8", 500)).toBe(false);
    expect(r.accepts("_inbox.a", "board-7", 1000)).toBe(false);
    expect(r.accepts("_inbox.b", "board-7", 500)).toBe(false);
  });

  test("a request that came from a peer is answered back to it; done forgets the route", () => {
    const r = new ReplyRoutes();
    r.received("_inbox.a", "hub", 1000);
    r.sent("_inbox.a", "board-7", 1000); // a relay: in from the hub, on to the board
    expect(r.backTo("_inbox.a", 10)).toBe("hub");
    expect(r.accepts("_inbox.a", "board-7", 10)).toBe(true);
    r.done("_inbox.a");
    expect(r.backTo("_inbox.a", 10)).toBeUndefined();
    expect(r.accepts("_inbox.a", "board-7", 10)).toBe(false);
  });

  test("expired routes are swept once many are kept", () => {
    const r = new ReplyRoutes();
    const past = Date.now() - 1;
    for (let i = 0; i < 10_000; i++) r.received(`_inbox.${i}`, "hub", past);
    r.received("_inbox.new", "hub", Date.now() + 60_000);
    expect(r.size).toBe(1);
  });
});
