/**
 * What one HTTP request costs a server on this runtime and kernel before
 * any keyop code runs, two ways side by side: `Bun.serve` (what the local
 * API is built on) and a hand-written HTTP/1.1 server on `Bun.listen`
 * (request line and headers found by hand, a Content-Length body, one
 * write of the answers of a read). Both take the local API's publish
 * request on a Unix socket and answer 201 with a fixed JSON body, nothing
 * stored. Each runs in its own process; 64 keep-alive connections (the
 * harness of the HTTP ingest step) send to one, then the other, in
 * alternating pairs. Per burst: the server's CPU (utime + stime from
 * /proc) per request. It prints each pair and one JSON line with the
 * medians: the answer to "would a server of our own be worth writing".
 *
 *   bun bench/http-request-floor.ts [--pairs=10] [--secs=1.5]
 */
import { rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { publishRate } from "./api.ts";
import { alternating, arg, quantile } from "./lib.ts";
import { spawnReady, stopProc } from "./procs.ts";
import { cpuOf } from "./servers.ts";

const ANSWER = '{"id":"019afc3e-0000-7000-8000-000000000000","channel":"bench.api","seq":1234567,"ts":1765000000000}';

/** `Bun.serve`: the body read whole, a fixed answer. */
function serveBun(socket: string): void {
  Bun.serve({
    unix: socket,
    async fetch(req) {
      await req.bytes();
      return new Response(ANSWER, { status: 201, headers: { "content-type": "application/json" } });
    },
  });
}

const HEAD_END = Buffer.from("\r\n\r\n");

/** A hand-written HTTP/1.1 server: only what the benchmark's requests need (no chunked bodies, no pipelined limits). */
function serveByHand(socket: string): void {
  const response = Buffer.from(`HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: ${ANSWER.length}\r\n\r\n${ANSWER}`);
  interface Conn {
    rest: Buffer | null;
    unsent: Buffer | null;
  }
  const send = (s: Bun.Socket<Conn>, bytes: Buffer): void => {
    const n = s.write(bytes);
    // A partial write: the rest goes on drain.
    if (n < bytes.length) s.data.unsent = s.data.unsent ? Buffer.concat([s.data.unsent, bytes.subarray(n)]) : bytes.subarray(n);
  };
  Bun.listen<Conn>({
    unix: socket,
    socket: {
      open(s) {
        s.data = { rest: null, unsent: null };
      },
      data(s, chunk) {
        const buf = s.data.rest ? Buffer.concat([s.data.rest, chunk]) : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.length);
        let off = 0;
        let answers = 0;
        for (;;) {
          const end = buf.indexOf(HEAD_END, off);
          if (end < 0) break;
          const head = buf.toString("latin1", off, end).toLowerCase();
          const at = head.indexOf("\r\ncontent-length:");
          const length = at < 0 ? 0 : Number.parseInt(head.slice(at + 17), 10);
          if (buf.length < end + 4 + length) break;
          off = end + 4 + length;
          answers++;
        }
        s.data.rest = off < buf.length ? Buffer.from(buf.subarray(off)) : null;
        if (answers === 0) return;
        if (s.data.unsent) {
          s.data.unsent = Buffer.concat([s.data.unsent, ...Array(answers).fill(response)]);
          return;
        }
        send(s, answers === 1 ? response : Buffer.concat(Array(answers).fill(response)));
      },
      drain(s) {
        const unsent = s.data.unsent;
        s.data.unsent = null;
        if (unsent) send(s, unsent);
      },
    },
  });
}

const ready = (socket: string) => async () => {
  try {
    return (await fetch("http://floor/", { unix: socket, method: "POST", body: "{}" } as RequestInit)).status === 201;
  } catch {
    return false;
  }
};

async function main(): Promise<void> {
  const pairs = Number(arg("pairs", "10"));
  const secs = Number(arg("secs", "1.5"));
  const sockets = { bun: join(tmpdir(), `keyop-floor-bun-${process.pid}.sock`), hand: join(tmpdir(), `keyop-floor-hand-${process.pid}.sock`) };
  const procs = {
    bun: await spawnReady([process.execPath, import.meta.path, "--serve=bun", sockets.bun], ready(sockets.bun), "Bun.serve floor", { stderr: "inherit" }),
    hand: await spawnReady([process.execPath, import.meta.path, "--serve=hand", sockets.hand], ready(sockets.hand), "hand-written floor", { stderr: "inherit" }),
  };
  const burst = async (kind: "bun" | "hand") => {
    const c0 = cpuOf(procs[kind].pid);
    const r = await publishRate(sockets[kind], 64, secs);
    if (r.errors > 0) throw new Error(`${r.errors} requests to the ${kind} server failed`);
    return { us: ((cpuOf(procs[kind].pid) - c0) * 1e6) / (r.rate * secs), rate: r.rate };
  };
  try {
    for (const kind of ["bun", "hand"] as const) await publishRate(sockets[kind], 64, 3);
    const us = { bun: [] as number[], hand: [] as number[] };
    const ratio: number[] = [];
    await alternating(
      pairs,
      () => burst("bun"),
      () => burst("hand"),
      (b, h, i) => {
        us.bun.push(b.us);
        us.hand.push(h.us);
        ratio.push(h.us / b.us);
        console.log(`pair ${i + 1}: Bun.serve ${b.us.toFixed(1)} µs/request ${Math.round(b.rate)}/s, by hand ${h.us.toFixed(1)} µs/request ${Math.round(h.rate)}/s`);
      },
    );
    const med = (a: number[]) => +quantile([...a], 0.5).toFixed(2);
    console.log(JSON.stringify({ workload: "http request floor, 64 connections", pairs, secs, bunServeUs: med(us.bun), byHandUs: med(us.hand), byHandOverBunServe: +quantile(ratio, 0.5).toFixed(3) }));
  } finally {
    for (const p of Object.values(procs)) await stopProc(p);
    for (const s of Object.values(sockets)) rmSync(s, { force: true });
  }
}

const serve = process.argv.find((a) => a.startsWith("--serve="))?.slice(8);
if (serve) {
  const socket = process.argv[process.argv.length - 1]!;
  rmSync(socket, { force: true });
  (serve === "hand" ? serveByHand : serveBun)(socket);
} else if (import.meta.main) {
  await main();
}
