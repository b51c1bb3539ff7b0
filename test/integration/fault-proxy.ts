/**
 * A loopback TCP proxy for fault tests: forwards to a target and can cut
 * every connection at once, or blackhole them (stop forwarding both ways
 * without closing, as a dead network path does).
 */
import type { Socket, TCPSocketListener } from "bun";

interface Pair {
  client: Socket<{ peer?: Socket<unknown>; pending: Uint8Array[] }>;
  upstream?: Socket<unknown>;
}

/** A running fault proxy. */
export class FaultProxy {
  private listener: TCPSocketListener<{ peer?: Socket<unknown>; pending: Uint8Array[] }>;
  private readonly pairs = new Set<Pair>();
  /** While true, bytes are swallowed in both directions and nothing is closed. */
  blackholed = false;
  cuts = 0;

  constructor(targetPort: number) {
    const self = this;
    this.listener = Bun.listen<{ peer?: Socket<unknown>; pending: Uint8Array[] }>({
      hostname: "127.0.0.1",
      port: 0,
      socket: {
        open(client) {
          client.data = { pending: [] };
          const pair: Pair = { client };
          self.pairs.add(pair);
          void Bun.connect({
            hostname: "127.0.0.1",
            port: targetPort,
            socket: {
              open(up) {
                pair.upstream = up;
                client.data.peer = up;
                for (const b of client.data.pending) up.write(b);
                client.data.pending = [];
              },
              data(_up, d) {
                if (!self.blackholed) client.write(d);
              },
              close() {
                // A dead path carries no FIN either: while blackholed, the other side hears nothing.
                if (!self.blackholed) client.end();
                self.pairs.delete(pair);
              },
              error() {
                if (!self.blackholed) client.end();
              },
            },
          }).catch(() => client.end());
        },
        data(client, d) {
          if (self.blackholed) return;
          if (client.data.peer) client.data.peer.write(d);
          else client.data.pending.push(new Uint8Array(d));
        },
        close(client) {
          for (const p of self.pairs) {
            if (p.client !== client) continue;
            if (!self.blackholed) p.upstream?.end();
            self.pairs.delete(p);
          }
        },
      },
    });
  }

  /** The port clients should connect to. */
  get port(): number {
    return this.listener.port;
  }

  /** Drops every connection at once (mid-frame, mid-batch: wherever they are). */
  cut(): void {
    this.cuts++;
    for (const p of this.pairs) {
      p.client.terminate();
      p.upstream?.terminate();
    }
    this.pairs.clear();
  }

  stop(): void {
    this.cut();
    this.listener.stop(true);
  }
}
