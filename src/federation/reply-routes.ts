/**
 * Where replies to requests that crossed this instance go, and where they
 * may come from. A request forwarded to a peer may be answered by that peer
 * only; a request received from a peer is answered back to that peer. Both
 * are remembered by the request's inbox until the request expires, in
 * memory only: a reply that finds no route is dropped (its requester times
 * out), which is all a reply is worth after a restart.
 */

interface Route {
  /** The peer the request was forwarded to: the only one whose reply is taken. */
  sentTo?: string;
  /** The peer the request came from: where a reply goes back. */
  cameFrom?: string;
  expires: number;
}

/** Most routes kept; past it the expired ones are swept. */
const SWEEP_AT = 10_000;

export class ReplyRoutes {
  private readonly routes = new Map<string, Route>();

  private route(inbox: string, expires: number): Route {
    let r = this.routes.get(inbox);
    if (!r) {
      if (this.routes.size >= SWEEP_AT) this.sweep(Date.now());
      r = { expires };
      this.routes.set(inbox, r);
    }
    r.expires = Math.max(r.expires, expires);
    return r;
  }

  /** A request on `inbox` went to `peer`. */
  sent(inbox: string, peer: string, expires: number): void {
    this.route(inbox, expires).sentTo = peer;
  }

  /** A request on `inbox` came from `peer`. */
  received(inbox: string, peer: string, expires: number): void {
    this.route(inbox, expires).cameFrom = peer;
  }

  /** Whether a reply to `inbox` from `peer` is one to take: the request went there and has not expired. */
  accepts(inbox: string, peer: string, now = Date.now()): boolean {
    const r = this.routes.get(inbox);
    return r !== undefined && r.sentTo === peer && r.expires > now;
  }

  /** The peer a reply to `inbox` goes back to, if the request came through one and has not expired. */
  backTo(inbox: string, now = Date.now()): string | undefined {
    const r = this.routes.get(inbox);
    return r && r.expires > now ? r.cameFrom : undefined;
  }

  /** The request was answered: its route is done. */
  done(inbox: string): void {
    this.routes.delete(inbox);
  }

  get size(): number {
    return this.routes.size;
  }

  private sweep(now: number): void {
    for (const [inbox, r] of this.routes) if (r.expires <= now) this.routes.delete(inbox);
  }
}
