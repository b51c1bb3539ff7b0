/**
 * The floor of the MQTT ingest step: a bare Bun MQTT server that takes
 * QoS 1 publishes and acknowledges each only once it is on disk, doing
 * nothing else. Every publish that arrived since the last commit goes into
 * one positioned write, then one fdatasync; the PUBACKs of a commit leave
 * in one socket write per connection. Two commits may be in flight (the
 * depth at which this machine's disk serves the most fdatasyncs a second,
 * docs/benchmarks.md), into a `RingFile`. No envelope, no
 * checksum, no index, no per-message promise: what a durable QoS 1 sink
 * costs on this runtime and disk before any keyop code runs.
 *
 *   bun bench/ingest-floor.ts <port> <file> [pool|inline] [GROUP]
 *
 * `pool` (default) runs each fdatasync on Bun's thread pool (a promise);
 * `inline` runs it on the event loop (`fdatasyncSync`), one at a time.
 * GROUP (default: no limit) caps the publishes of one commit: with one
 * client and a window of them in flight, smaller commits let the client
 * send the next while the disk flushes.
 */
import { open } from "node:fs/promises";
import { RingFile } from "./ring-file.ts";

const DEPTH = 2;

interface Conn {
  sock: Bun.Socket<Conn>;
  rest: Uint8Array;
  /** PUBACKs waiting for the socket to drain. */
  out: Uint8Array[];
}

interface Publish {
  conn: Conn;
  id: number;
  payload: Uint8Array;
}

const PINGRESP = new Uint8Array([0xd0, 0]);
const CONNACK = new Uint8Array([0x20, 2, 0, 0]);

function send(c: Conn, bytes: Uint8Array): void {
  if (c.out.length > 0) {
    c.out.push(bytes);
    return;
  }
  const n = c.sock.write(bytes);
  if (n < bytes.length) c.out.push(bytes.subarray(Math.max(n, 0)));
}

function drain(c: Conn): void {
  while (c.out.length > 0) {
    const b = c.out[0]!;
    const n = c.sock.write(b);
    if (n < b.length) {
      c.out[0] = b.subarray(Math.max(n, 0));
      return;
    }
    c.out.shift();
  }
}

async function main(): Promise<void> {
  const port = Number(process.argv[2]);
  const file = process.argv[3]!;
  const mode = (process.argv[4] ?? "pool") as "pool" | "inline";
  const group = Number(process.argv[5] ?? Number.POSITIVE_INFINITY);
  const ring = new RingFile(file);
  const fh = await open(file, "r+");
  let pending: Publish[] = [];
  let inflight = 0;
  let scheduled = false;

  const acknowledge = (batch: Publish[]): void => {
    const byConn = new Map<Conn, number[]>();
    for (const p of batch) {
      const ids = byConn.get(p.conn);
      if (ids) ids.push(p.id);
      else byConn.set(p.conn, [p.id]);
    }
    for (const [c, ids] of byConn) {
      const acks = new Uint8Array(ids.length * 4);
      for (let i = 0; i < ids.length; i++) {
        acks[i * 4] = 0x40;
        acks[i * 4 + 1] = 2;
        acks[i * 4 + 2] = ids[i]! >> 8;
        acks[i * 4 + 3] = ids[i]! & 0xff;
      }
      send(c, acks);
    }
  };

  const commit = (): void => {
    scheduled = false;
    while (pending.length > 0 && inflight < (mode === "pool" ? DEPTH : 1)) {
      const batch = pending.length <= group ? pending : pending.splice(0, group);
      if (batch === pending) pending = [];
      ring.write(batch.map((p) => p.payload));
      if (mode === "inline") {
        ring.sync();
        acknowledge(batch);
        continue;
      }
      inflight++;
      void fh.datasync().then(() => {
        inflight--;
        acknowledge(batch);
        commit();
      });
    }
  };

  const take = (c: Conn, chunk: Uint8Array): void => {
    let buf = c.rest.length > 0 ? Buffer.concat([c.rest, chunk]) : chunk;
    let at = 0;
    while (at + 2 <= buf.length) {
      let len = 0;
      let mul = 1;
      let i = at + 1;
      for (; i < buf.length && i < at + 5; i++) {
        len += (buf[i]! & 0x7f) * mul;
        mul *= 128;
        if ((buf[i]! & 0x80) === 0) break;
      }
      if (i >= buf.length) break;
      const start = i + 1;
      if (start + len > buf.length) break;
      const type = buf[at]! >> 4;
      if (type === 3) {
        const topicLen = (buf[start]! << 8) | buf[start + 1]!;
        const qos = (buf[at]! >> 1) & 3;
        const idAt = start + 2 + topicLen;
        const id = qos > 0 ? (buf[idAt]! << 8) | buf[idAt + 1]! : 0;
        // (Each read comes in a buffer of its own, so a view of it stays valid.)
        const payload = buf.subarray(idAt + (qos > 0 ? 2 : 0), start + len);
        if (qos > 0) pending.push({ conn: c, id, payload });
      } else if (type === 1) send(c, CONNACK);
      else if (type === 12) send(c, PINGRESP);
      else if (type === 14) c.sock.end();
      at = start + len;
    }
    c.rest = at < buf.length ? buf.slice(at) : new Uint8Array(0);
    buf = c.rest;
    if (pending.length > 0 && !scheduled) {
      // Everything that arrives in this turn joins one commit.
      scheduled = true;
      setImmediate(commit);
    }
  };

  Bun.listen<Conn>({
    hostname: "127.0.0.1",
    port,
    socket: {
      open(sock) {
        sock.data = { sock, rest: new Uint8Array(0), out: [] };
      },
      data(sock, chunk) {
        take(sock.data, chunk);
      },
      drain(sock) {
        drain(sock.data);
      },
    },
  });
}

if (import.meta.main) await main();
