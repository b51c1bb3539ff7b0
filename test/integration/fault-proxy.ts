/**
 * A loopback TCP proxy for fault tests: forwards to a target and can add
 * latency, deliver bytes in small pieces (partial writes), cut every
 * connection at once (mid-frame, mid-batch: wherever they are), or
 * blackhole them (stop forwarding both ways without closing, as a dead
 * network path does), and shape them: a byte rate per direction (a token
 * bucket) with `delayMs` as the fixed delay each way, as a cellular or
 * satellite link. Bytes are never dropped while forwarding: what a socket
 * does not take is kept and written on its drain.
 */
import type { Socket, TCPSocketListener } from "bun";

/** One direction of a connection: what waits to be written to `to`. */
class Pipe {
  private readonly queue: { bytes: Uint8Array; due: number }[] = [];
  private timer: ReturnType<typeof setTimeout> | null = null;
  to: Socket<any> | null = null;
  /** Bytes written on so far. */
  forwarded = 0;
  /** The shaper's bucket: bytes that may go now, and when it was filled last. */
  private tokens = 0;
  private filledAt = performance.now();

  constructor(private readonly proxy: FaultProxy) {}

  /** How many bytes the shaper lets go now (all of them when unshaped). */
  private allowance(): number {
    const rate = this.proxy.rateBytesPerS;
    if (rate <= 0) return Number.POSITIVE_INFINITY;
    const now = performance.now();
    // A bucket of 50 ms: bursts no longer than a modem's buffer would let through.
    this.tokens = Math.min(rate / 20, this.tokens + ((now - this.filledAt) * rate) / 1000);
    this.filledAt = now;
    return Math.floor(this.tokens);
  }

  push(bytes: Uint8Array): void {
    this.queue.push({ bytes: new Uint8Array(bytes), due: performance.now() + this.proxy.delayMs });
    this.pump();
  }

  /** Writes what is due, in pieces of at most `chunkBytes`, until the socket takes no more. */
  pump(): void {
    if (this.timer || !this.to) return;
    while (this.queue.length > 0) {
      if (this.proxy.blackholed) return;
      const head = this.queue[0]!;
      const wait = head.due - performance.now();
      if (wait > 0) {
        this.timer = setTimeout(() => {
          this.timer = null;
          this.pump();
        }, wait);
        return;
      }
      const allowed = this.allowance();
      if (allowed < 1) {
        // Shaped: wait for the bucket to hold a few hundred bytes (or what is left of this chunk).
        const want = Math.min(head.bytes.length, 512, Math.max(1, this.proxy.rateBytesPerS / 100));
        this.timer = setTimeout(
          () => {
            this.timer = null;
            this.pump();
          },
          Math.max(1, ((want - this.tokens) * 1000) / this.proxy.rateBytesPerS),
        );
        return;
      }
      let piece = this.proxy.chunkBytes > 0 ? head.bytes.subarray(0, this.proxy.chunkBytes) : head.bytes;
      if (piece.length > allowed) piece = piece.subarray(0, allowed);
      const n = Math.max(0, this.to.write(piece));
      this.forwarded += n;
      if (this.proxy.rateBytesPerS > 0) this.tokens -= n;
      head.bytes = head.bytes.subarray(n);
      if (head.bytes.length === 0) this.queue.shift();
      if (n < piece.length) return; // the socket is full: its drain calls pump again
      if (this.proxy.chunkBytes > 0 && this.queue.length > 0) {
        // One piece per turn: the receiver sees the bytes arrive in fragments.
        this.timer = setTimeout(() => {
          this.timer = null;
          this.pump();
        }, 0);
        return;
      }
    }
  }

  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.queue.length = 0;
  }
}

interface Pair {
  client: Socket<ClientData>;
  upstream?: Socket<unknown>;
  up: Pipe;
  down: Pipe;
}

interface ClientData {
  pair?: Pair;
}

/** A running fault proxy. */
export class FaultProxy {
  private listener: TCPSocketListener<ClientData>;
  private readonly pairs = new Set<Pair>();
  /** While true, bytes are held in both directions and nothing is closed. */
  blackholed = false;
  /** Added to every byte's trip through the proxy, each way. */
  delayMs = 0;
  /** When above 0, bytes are written in pieces of at most this many, one piece per event-loop turn. */
  chunkBytes = 0;
  /** When above 0, each direction of each connection carries at most this many bytes per second. */
  rateBytesPerS = 0;
  /** While true the link is down: new connections are closed at once (as a refused dial). */
  refusing = false;
  cuts = 0;
  /** Bytes forwarded towards the target (up) and back (down), over connections that ended too. */
  private endedUp = 0;
  private endedDown = 0;

  constructor(targetPort: number) {
    const self = this;
    this.listener = Bun.listen<ClientData>({
      hostname: "127.0.0.1",
      port: 0,
      socket: {
        open(client) {
          if (self.refusing) {
            client.end();
            return;
          }
          const pair: Pair = { client, up: new Pipe(self), down: new Pipe(self) };
          pair.down.to = client;
          client.data = { pair };
          self.pairs.add(pair);
          void Bun.connect({
            hostname: "127.0.0.1",
            port: targetPort,
            socket: {
              open(up) {
                pair.upstream = up;
                pair.up.to = up;
                pair.up.pump();
              },
              data(_up, d) {
                pair.down.push(d);
              },
              drain() {
                pair.up.pump();
              },
              close() {
                // A dead path carries no FIN either: while blackholed, the other side hears nothing.
                if (!self.blackholed) client.end();
                self.drop(pair);
              },
              error() {
                if (!self.blackholed) client.end();
              },
            },
          }).catch(() => client.end());
        },
        data(client, d) {
          client.data?.pair?.up.push(d);
        },
        drain(client) {
          client.data?.pair?.down.pump();
        },
        close(client) {
          const p = client.data?.pair;
          if (!p) return;
          if (!self.blackholed) p.upstream?.end();
          self.drop(p);
        },
      },
    });
  }

  private drop(p: Pair): void {
    p.up.stop();
    p.down.stop();
    if (this.pairs.delete(p)) {
      this.endedUp += p.up.forwarded;
      this.endedDown += p.down.forwarded;
    }
  }

  /** Bytes forwarded so far towards the target (`up`) and back (`down`). */
  bytes(): { up: number; down: number } {
    let up = this.endedUp;
    let down = this.endedDown;
    for (const p of this.pairs) {
      up += p.up.forwarded;
      down += p.down.forwarded;
    }
    return { up, down };
  }

  /** The port clients should connect to. */
  get port(): number {
    return this.listener.port;
  }

  /** Ends the blackhole: what was held is delivered. */
  heal(): void {
    this.blackholed = false;
    for (const p of this.pairs) {
      p.up.pump();
      p.down.pump();
    }
  }

  /** Drops every connection at once (mid-frame, mid-batch: wherever they are), as a reset. */
  cut(): void {
    this.cuts++;
    for (const p of [...this.pairs]) {
      p.client.terminate();
      p.upstream?.terminate();
      this.drop(p);
    }
  }

  stop(): void {
    this.cut();
    this.listener.stop(true);
  }
}
