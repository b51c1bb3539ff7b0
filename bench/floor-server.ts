/**
 * The floor of the steady-rate benchmark: a bare `Bun.listen` server that
 * takes fixed 256-byte messages over TCP and answers 4 bytes for each, with
 * nothing else (`answer`), or after writing each message to a file in one
 * of the ways a store could. What it costs per message is what the runtime
 * allows before any keyop code runs.
 *
 *   bun bench/floor-server.ts <port> <mode> <file>
 */
import { fdatasyncSync, openSync, writeSync } from "node:fs";
import { open } from "node:fs/promises";

export const FLOOR_MODES = ["answer", "writeSync", "writeSync+fdatasync", "fh.write", "fh.write+datasync"] as const;
export type FloorMode = (typeof FLOOR_MODES)[number];
export const FLOOR_MESSAGE = 256;

async function main(): Promise<void> {
  const [port, mode, file] = [Number(process.argv[2]), process.argv[3] as FloorMode, process.argv[4]!];
  if (!FLOOR_MODES.includes(mode)) throw new Error(`mode: one of ${FLOOR_MODES.join(", ")}`);
  const fd = openSync(file, "w");
  const fh = await open(file + ".fh", "w");
  const ANSWER = new Uint8Array([0x40, 2, 0, 1]);
  // Takes whole messages from the stream and handles each one in order.
  const take = async (sock: { write(b: Uint8Array): number }, msg: Uint8Array): Promise<void> => {
    if (mode === "writeSync" || mode === "writeSync+fdatasync") {
      writeSync(fd, msg);
      if (mode === "writeSync+fdatasync") fdatasyncSync(fd);
    } else if (mode === "fh.write" || mode === "fh.write+datasync") {
      await fh.write(msg);
      if (mode === "fh.write+datasync") await fh.datasync();
    }
    sock.write(ANSWER);
  };
  Bun.listen<{ rest: Uint8Array }>({
    hostname: "127.0.0.1",
    port,
    socket: {
      open(s) {
        s.data = { rest: new Uint8Array(0) };
      },
      async data(s, chunk) {
        let buf = s.data.rest.length ? Buffer.concat([s.data.rest, chunk]) : chunk;
        while (buf.length >= FLOOR_MESSAGE) {
          await take(s, buf.subarray(0, FLOOR_MESSAGE));
          buf = buf.subarray(FLOOR_MESSAGE);
        }
        s.data.rest = buf;
      },
    },
  });
}

if (import.meta.main) await main();
