/**
 * The floor of the HTTP ingest step: a bare `Bun.serve` on a Unix socket
 * that answers each POST with 201 only once its body is on disk, doing
 * nothing else. The bodies that arrived since the last commit go into one
 * positioned write (a `RingFile`) and one fdatasync on the event loop (the faster of the
 * two ways the MQTT floor measured, bench/ingest-floor.ts), then every
 * request of the commit is answered. No parsing, no envelope, no index:
 * what a durable HTTP publish costs on this runtime and disk before any
 * keyop code runs.
 *
 *   bun bench/http-floor.ts <socket> <file>
 */
import { rmSync } from "node:fs";
import { RingFile } from "./ring-file.ts";

const CREATED = { status: 201, headers: { "content-type": "application/json" } };

interface Waiting {
  body: Uint8Array;
  done: (r: Response) => void;
}

function main(): void {
  const socket = process.argv[2]!;
  const file = process.argv[3]!;
  const ring = new RingFile(file);
  let seq = 0;
  let pending: Waiting[] = [];
  let scheduled = false;

  const commit = (): void => {
    scheduled = false;
    const batch = pending;
    pending = [];
    ring.write(batch.map((w) => w.body));
    ring.sync();
    for (const w of batch) w.done(new Response(`{"seq":${++seq}}`, CREATED));
  };

  rmSync(socket, { force: true });
  Bun.serve({
    unix: socket,
    async fetch(req) {
      const body = new Uint8Array(await req.arrayBuffer());
      return new Promise<Response>((done) => {
        pending.push({ body, done });
        if (!scheduled) {
          // Everything that arrives in this turn joins one commit.
          scheduled = true;
          setImmediate(commit);
        }
      });
    },
  });
}

if (import.meta.main) main();
