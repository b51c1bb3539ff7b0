/**
 * `keyop import`: stores back what `keyop export` wrote (stdin), through
 * the running agent, in batches. Ids are kept, so a message its channel
 * holds already is dropped as a duplicate: importing a file twice, or
 * again after an interrupted import, stores each message once.
 */
import { Packr, Unpackr } from "msgpackr";
import { LocalClient } from "../client/local-client.ts";
import { envelopeFromWire, fromJson } from "../envelope/json.ts";
import { parseArgs, UsageError } from "./args.ts";

export const IMPORT_USAGE = `usage: keyop import [--format ndjson|msgpack] [--socket PATH] < FILE

Stores the messages of FILE, as "keyop export" wrote them, in the running
agent: each in its channel, with its id, time, origin and route; a message
whose id its channel holds already is dropped (counted as a duplicate).
The format is found from the first byte unless --format says it. A bad
message stops the import at its line (what came before it is stored;
import again once it is fixed: the stored ones are dropped as duplicates).`;

/** Messages and bytes per request to the agent. */
const BATCH_MESSAGES = 1000;
const BATCH_BYTES = 4 * 1024 * 1024;

class BadInput extends Error {}

export async function cmdImport(argv: string[]): Promise<number> {
  const p = parseArgs(argv, { format: "string", socket: "string" }, 0);
  if (p.help) return (void console.log(IMPORT_USAGE), 0);
  let format = p.flags.format as string | undefined;
  if (format !== undefined && format !== "ndjson" && format !== "msgpack") throw new UsageError(`--format ${JSON.stringify(format)}: ndjson or msgpack`);
  const client = new LocalClient({ socket: p.flags.socket as string | undefined });
  let imported = 0;
  let duplicates = 0;
  const started = performance.now();
  let lastProgress = started;
  const send = async (body: Uint8Array | string, type: string) => {
    const r = await client.call<{ imported: number; duplicates: number }>("POST", "/v1/import", body, type);
    imported += r.imported;
    duplicates += r.duplicates;
    const now = performance.now();
    if (now - lastProgress >= 1000) {
      lastProgress = now;
      process.stderr.write(`keyop import: ${imported} imported, ${duplicates} duplicates, ${((now - started) / 1000).toFixed(1)} s\r`);
    }
  };
  try {
    const input = Bun.stdin.stream() as ReadableStream<Uint8Array>;
    const reader = input.getReader();
    const first = await reader.read();
    if (first.done || first.value.length === 0) {
      process.stderr.write("keyop import: no input\n");
      return 1;
    }
    format ??= first.value[0] === 0x7b || first.value[0] === 0x0a ? "ndjson" : "msgpack";
    const chunks = (async function* () {
      yield first.value;
      for (;;) {
        const r = await reader.read();
        if (r.done) return;
        yield r.value;
      }
    })();
    if (format === "ndjson") await importNdjson(chunks, send);
    else await importMsgpack(chunks, send);
  } catch (err) {
    if (!(err instanceof BadInput)) throw err;
    process.stderr.write(`keyop import: ${err.message}; ${imported} imported before it, ${duplicates} duplicates\n`);
    return 1;
  }
  process.stderr.write(`keyop import: ${imported} imported, ${duplicates} duplicates\n`);
  return 0;
}

async function importNdjson(chunks: AsyncIterable<Uint8Array>, send: (body: string, type: string) => Promise<void>): Promise<void> {
  const dec = new TextDecoder("utf-8", { fatal: true });
  let rest = "";
  let lineNo = 0;
  let batch: string[] = [];
  let bytes = 0;
  const flush = async () => {
    if (batch.length === 0) return;
    const body = batch.join("\n") + "\n";
    batch = [];
    bytes = 0;
    await send(body, "application/x-ndjson");
  };
  const line = async (l: string) => {
    lineNo++;
    if (l.trim() === "") return;
    let v: unknown;
    try {
      v = fromJson(l);
    } catch (err) {
      throw new BadInput(`line ${lineNo}: invalid JSON: ${err instanceof Error ? err.message : String(err)}`);
    }
    if (!envelopeFromWire(v)) throw new BadInput(`line ${lineNo}: not an exported envelope (id, ts, channel, origin, type, route, payload)`);
    batch.push(l);
    bytes += l.length + 1;
    if (batch.length >= BATCH_MESSAGES || bytes >= BATCH_BYTES) await flush();
  };
  try {
    for await (const c of chunks) {
      try {
        rest += dec.decode(c, { stream: true });
      } catch {
        throw new BadInput(`near line ${lineNo + 1}: not UTF-8 text (use --format msgpack for a msgpack export)`);
      }
      const lines = rest.split("\n");
      rest = lines.pop()!;
      for (const l of lines) await line(l);
    }
    if (rest !== "") await line(rest);
  } finally {
    // What came before a bad line is stored too.
    await flush();
  }
}

async function importMsgpack(chunks: AsyncIterable<Uint8Array>, send: (body: Uint8Array, type: string) => Promise<void>): Promise<void> {
  const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true });
  const packr = new Packr({ useRecords: false, moreTypes: false, encodeUndefinedAsNil: true });
  let buf = new Uint8Array(0);
  let index = 0;
  let offset = 0;
  let batch: unknown[] = [];
  let bytes = 0;
  const flush = async () => {
    if (batch.length === 0) return;
    const body = packr.pack(batch);
    batch = [];
    bytes = 0;
    await send(body, "application/msgpack");
  };
  try {
    for await (const c of chunks) {
      const joined = new Uint8Array(buf.length + c.length);
      joined.set(buf);
      joined.set(c, buf.length);
      let used = 0;
      const values: [unknown, number][] = [];
      try {
        unpackr.unpackMultiple(joined, (v: unknown, start?: number, end?: number) => {
          values.push([v, (end ?? 0) - (start ?? 0)]);
          used = end ?? used;
        });
      } catch {
        // The chunk ends inside a message: the rest comes with the next one.
      }
      buf = joined.subarray(used);
      for (const [v, size] of values) {
        if (!envelopeFromWire(v)) throw new BadInput(`message ${index + 1} (byte ${offset}): not an exported envelope`);
        index++;
        offset += size;
        batch.push(v);
        bytes += size;
        if (batch.length >= BATCH_MESSAGES || bytes >= BATCH_BYTES) await flush();
      }
    }
    if (buf.length > 0) throw new BadInput(`message ${index + 1} (byte ${offset}): incomplete or invalid msgpack`);
  } finally {
    await flush();
  }
}
