/**
 * A minimal HTTP/1.1 keep-alive client over a Unix socket for benchmarks:
 * one request in flight per connection, Content-Length framed answers.
 * `fetch` tops out near 20,000 requests/s here and would hide the server.
 */
import type { Socket } from "bun";

const CRLF2 = Buffer.from("\r\n\r\n");

/** One keep-alive connection. */
export class RawHttp {
  private sock!: Socket<undefined>;
  private buf: Buffer = Buffer.alloc(0);
  private waiter: ((r: { status: number; body: Buffer }) => void) | null = null;
  private failer: ((e: Error) => void) | null = null;

  /** Connects to the Unix socket `path`. */
  static async connect(path: string): Promise<RawHttp> {
    const c = new RawHttp();
    c.sock = await Bun.connect({
      unix: path,
      socket: {
        data: (_s, chunk) => c.onData(chunk),
        drain: () => c.flush(),
        close: () => c.failer?.(new Error("connection closed")),
        error: (_s, e) => c.failer?.(e),
      },
    });
    return c;
  }

  /** Builds the bytes of a request once, to send many times. */
  static request(method: string, path: string, body?: string | Uint8Array, contentType = "application/json"): Uint8Array {
    const b = body === undefined ? Buffer.alloc(0) : Buffer.from(body);
    const head = `${method} ${path} HTTP/1.1\r\nHost: keyop\r\n${body !== undefined ? `Content-Type: ${contentType}\r\n` : ""}Content-Length: ${b.length}\r\n\r\n`;
    return Buffer.concat([Buffer.from(head), b]);
  }

  /** Sends one request and resolves with the answer's status and body. */
  send(req: Uint8Array): Promise<{ status: number; body: Buffer }> {
    return new Promise((resolve, reject) => {
      this.waiter = resolve;
      this.failer = reject;
      this.pending = req;
      this.flush();
    });
  }

  private pending: Uint8Array | null = null;

  /** Writes what is left of the request; a large body goes out over several drains. */
  private flush(): void {
    if (!this.pending) return;
    const n = this.sock.write(this.pending);
    this.pending = n >= this.pending.length ? null : this.pending.subarray(Math.max(0, n));
  }

  private onData(chunk: Buffer): void {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    const end = this.buf.indexOf(CRLF2);
    if (end < 0) return;
    const head = this.buf.subarray(0, end).toString("latin1");
    const m = /content-length: *(\d+)/i.exec(head);
    const len = m ? Number(m[1]) : 0;
    if (this.buf.length < end + 4 + len) return;
    const status = Number(head.slice(9, 12));
    const body = this.buf.subarray(end + 4, end + 4 + len);
    this.buf = this.buf.subarray(end + 4 + len);
    const w = this.waiter;
    this.waiter = null;
    w?.({ status, body });
  }

  close(): void {
    this.waiter = null;
    this.failer = null;
    this.sock.end();
  }
}
