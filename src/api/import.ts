/**
 * `POST /v1/import`: messages as `keyop export` wrote them (NDJSON
 * envelopes, or a msgpack array of envelope maps), stored with their ids,
 * times, origins and routes; one whose id its channel holds already is
 * dropped. Answers `{"imported": N, "duplicates": M}`.
 */
import { Packr } from "msgpackr";
import type { EnvelopeFields } from "../envelope/envelope.ts";
import { envelopeFromWire, fromJson } from "../envelope/json.ts";
import { BadRequestError, KeyopError } from "../errors.ts";
import type { Messenger } from "../messenger/messenger.ts";
import { json, mediaType, readBody } from "./http.ts";

const msgpack = new Packr({ useRecords: false, mapsAsObjects: true });
const utf8 = new TextDecoder("utf-8", { fatal: true });

function envelope(v: unknown, where: string): EnvelopeFields {
  const f = envelopeFromWire(v);
  if (!f) throw new BadRequestError(`${where}: not an exported envelope (id, ts, channel, origin, type, route, payload)`);
  return f;
}

export async function handleImport(req: Request, messenger: Messenger, maxBytes: number): Promise<Response> {
  const type = mediaType(req);
  const body = await readBody(req, maxBytes);
  const entries: EnvelopeFields[] = [];
  if (type === "application/x-ndjson" || type === "application/ndjson") {
    let text: string;
    try {
      text = utf8.decode(body);
    } catch {
      throw new BadRequestError("body is not valid UTF-8");
    }
    text.split("\n").forEach((line, i) => {
      if (line.trim() === "") return;
      let v: unknown;
      try {
        v = fromJson(line);
      } catch (err) {
        throw new BadRequestError(`line ${i + 1}: invalid JSON: ${err instanceof Error ? err.message : String(err)}`);
      }
      entries.push(envelope(v, `line ${i + 1}`));
    });
  } else if (type === "application/msgpack" || type === "application/x-msgpack") {
    let v: unknown;
    try {
      v = msgpack.unpack(body);
    } catch (err) {
      throw new BadRequestError(`invalid msgpack: ${err instanceof Error ? err.message : String(err)}`);
    }
    if (!Array.isArray(v)) throw new BadRequestError("a msgpack import is an array of envelope maps");
    v.forEach((o, i) => {
      entries.push(envelope(o, `item ${i}`));
    });
  } else {
    throw new KeyopError("unsupported_media_type", `content type "${type}" is not accepted: use application/x-ndjson or application/msgpack`);
  }
  if (entries.length === 0) throw new BadRequestError("the import holds no message");
  return json(200, await messenger.importEnvelopes(entries));
}
