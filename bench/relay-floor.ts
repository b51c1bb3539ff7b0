/**
 * The two-hop floor of the steady-rate benchmark: three bare Bun processes
 * that carry fixed 256-byte messages A → hub → B over mutual TLS (TLS 1.3,
 * P-256 certificates of one CA, as keyop's links) and do nothing else. A
 * takes messages from a publisher over TCP and answers 4 bytes for each;
 * the hub answers its sender 4 bytes per read (an acknowledgement of what
 * came, as keyop's held ACKs) and sends each message on; B answers the hub
 * the same way and hands every message to a subscriber over
 * TCP, which answers 4 bytes each (as a QoS 1 PUBACK). No storage, no
 * parsing beyond cutting the stream into messages: what the runtime costs
 * for two hops before any keyop code runs.
 *
 * With `sync` last, each process first stores what a read brought, as
 * keyop's `sync: always` does before it answers or passes anything on: one
 * `writeSync` into a preallocated file and one `fdatasyncSync` per read,
 * inline (the cheapest durable hop Bun allows: no thread pool, no
 * file-size metadata to commit). That is the floor of the `always` tail.
 *
 *   bun bench/relay-floor.ts a   <publisher port> <hub port> <cert dir> [sync]
 *   bun bench/relay-floor.ts hub <hub port> <cert dir> [sync]
 *   bun bench/relay-floor.ts b   <subscriber port> <hub port> <cert dir> [sync]
 */
import { fdatasyncSync, openSync, readFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { constants } from "node:crypto";
import type { Socket } from "bun";

export const RELAY_MESSAGE = 256;
const ANSWER = new Uint8Array([0x40, 2, 0, 1]);

/** `n` answers in one buffer. */
function answers(n: number): Uint8Array {
  const b = new Uint8Array(4 * n);
  for (let i = 0; i < n; i++) b.set(ANSWER, 4 * i);
  return b;
}

/** The TLS options of one role, from `<dir>/{ca,<role>}.pem` and `<role>.key`. */
function tlsOf(dir: string, role: string) {
  return {
    cert: readFileSync(join(dir, `${role}.pem`), "utf8"),
    key: readFileSync(join(dir, `${role}.key`), "utf8"),
    ca: readFileSync(join(dir, "ca.pem"), "utf8"),
    requestCert: true,
    rejectUnauthorized: true,
    secureOptions: constants.SSL_OP_NO_TLSv1 | constants.SSL_OP_NO_TLSv1_1 | constants.SSL_OP_NO_TLSv1_2,
  };
}

/** The preallocated file's size: positions wrap around inside it, so no write grows the file. */
const STORE_BYTES = 16 * 1024 * 1024;

/**
 * Stores whole messages durably before they go on: `bytes` (a whole number of
 * messages, contiguous) written at the next position of `<path>` and
 * fdatasynced. The file is filled with zeros and synced first, as keyop
 * preallocates its segments.
 */
export function durableStore(path: string): (bytes: Uint8Array) => void {
  const fd = openSync(path, "w+");
  const zeros = new Uint8Array(1024 * 1024);
  for (let at = 0; at < STORE_BYTES; at += zeros.length) writeSync(fd, zeros, 0, zeros.length, at);
  fdatasyncSync(fd);
  let pos = 0;
  return (bytes) => {
    if (pos + bytes.length > STORE_BYTES) pos = 0;
    let done = 0;
    while (done < bytes.length) done += writeSync(fd, bytes, done, bytes.length - done, pos + done);
    pos += bytes.length;
    fdatasyncSync(fd);
  };
}

/**
 * Cuts a byte stream into whole messages. Once per read that completed any:
 * `store` gets them as one contiguous view (when storing), then `each` gets
 * every message and `done` how many came.
 */
function messages(each: (m: Uint8Array) => void, done: (n: number) => void, store?: (bytes: Uint8Array) => void) {
  let rest = new Uint8Array(0);
  return (chunk: Uint8Array) => {
    const buf = rest.length ? Buffer.concat([rest, chunk]) : chunk;
    const whole = buf.length - (buf.length % RELAY_MESSAGE);
    const n = whole / RELAY_MESSAGE;
    if (n > 0) {
      store?.(buf.subarray(0, whole));
      for (let at = 0; at < whole; at += RELAY_MESSAGE) each(buf.subarray(at, at + RELAY_MESSAGE));
    }
    rest = whole < buf.length ? Uint8Array.from(buf.subarray(whole)) : new Uint8Array(0);
    if (n > 0) done(n);
  };
}

/** Writes all of `bytes` (what the socket does not take waits for its drain). */
function sender(): { write: (s: Socket<unknown>, b: Uint8Array) => void; drain: (s: Socket<unknown>) => void } {
  const pending: Uint8Array[] = [];
  const flush = (s: Socket<unknown>) => {
    while (pending.length > 0) {
      const b = pending[0]!;
      const n = s.write(b);
      if (n < b.length) {
        pending[0] = b.subarray(Math.max(0, n));
        return;
      }
      pending.shift();
    }
  };
  return {
    write(s, b) {
      if (pending.length > 0) pending.push(b);
      else {
        const n = s.write(b);
        if (n < b.length) pending.push(b.subarray(Math.max(0, n)));
      }
    },
    drain: flush,
  };
}

async function main(): Promise<void> {
  const role = process.argv[2];
  const ignore = () => {};
  const sync = process.argv.at(-1) === "sync";
  const storeIn = (dir: string) => (sync ? durableStore(join(dir, `${role}.store`)) : undefined);
  if (role === "hub") {
    const [port, dir] = [Number(process.argv[3]), process.argv[4]!];
    const store = storeIn(dir);
    // Messages go to the connection whose certificate is B's.
    let toB: Socket<unknown> | undefined;
    const out = sender();
    Bun.listen<{ feed: (c: Uint8Array) => void }>({
      hostname: "127.0.0.1",
      port,
      tls: tlsOf(dir, "hub"),
      socket: {
        open(s) {
          s.data = {
            feed: messages(
              (m) => toB && out.write(toB, Uint8Array.from(m)),
              () => s.write(ANSWER),
              store,
            ),
          };
        },
        handshake(s, ok) {
          if (ok && (s.getPeerCertificate() as { subject?: { CN?: string } } | undefined)?.subject?.CN === "b") toB = s;
        },
        data(s, chunk) {
          // What B sends are its answers.
          if (s !== toB) s.data.feed(chunk);
        },
        drain(s) {
          if (s === toB) out.drain(s);
        },
      },
    });
    return;
  }
  const [port, hubPort, dir] = [Number(process.argv[3]), Number(process.argv[4]), process.argv[5]!];
  const store = storeIn(dir);
  if (role === "a") {
    const out = sender();
    const hub = await Bun.connect({ hostname: "127.0.0.1", port: hubPort, tls: { ...tlsOf(dir, "a"), serverName: "127.0.0.1" }, socket: { data: ignore, drain: (s) => out.drain(s) } });
    Bun.listen<{ feed: (c: Uint8Array) => void }>({
      hostname: "127.0.0.1",
      port,
      socket: {
        open(s) {
          // One answer per message, as a broker's PUBACK; written together per read.
          s.data = {
            feed: messages(
              (m) => out.write(hub, Uint8Array.from(m)),
              (n) => s.write(answers(n)),
              store,
            ),
          };
        },
        data(s, chunk) {
          s.data.feed(chunk);
        },
      },
    });
    return;
  }
  if (role === "b") {
    let sub: Socket<unknown> | undefined;
    const out = sender();
    await Bun.connect<{ feed: (c: Uint8Array) => void }>({
      hostname: "127.0.0.1",
      port: hubPort,
      tls: { ...tlsOf(dir, "b"), serverName: "127.0.0.1" },
      socket: {
        open(s) {
          s.data = {
            feed: messages(
              (m) => sub && out.write(sub, Uint8Array.from(m)),
              () => s.write(ANSWER),
              store,
            ),
          };
        },
        data(s, chunk) {
          s.data.feed(chunk);
        },
      },
    });
    Bun.listen({
      hostname: "127.0.0.1",
      port,
      socket: {
        open(s) {
          sub = s;
        },
        data: ignore,
        drain: (s) => out.drain(s),
      },
    });
    return;
  }
  throw new Error("role: a, hub or b");
}

if (import.meta.main) await main();
