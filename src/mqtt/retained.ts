/**
 * MQTT retained messages: the last retained message of each channel, with
 * the QoS it was published with and its MQTT 5 properties (MessageMeta:
 * user properties, content type, expiry...), kept durably in
 * `<data_dir>/mqtt-retained/` (one file per channel, `<channel>.rmsg`, a
 * msgpack map `{qos, payload, ...meta}`, replaced atomically: temp file,
 * fsync, rename, directory fsync) and held in memory for new
 * subscriptions. An empty retained payload clears the channel's.
 *
 * The QoS is kept because a new subscription gets the retained message at
 * the lower of it and the subscription's QoS, as MQTT asks: a retained
 * QoS 1 "device offline" must reach a QoS 1 subscriber acknowledged, not
 * as fire-and-forget. Files of the first versions (`<channel>.retained`,
 * QoS 0, and `.retained1`, QoS 1: the bare payload) are still read.
 */
import { mkdir, readdir, readFile, stat } from "node:fs/promises";
import { join } from "node:path";
import { decodeValue, encodeValue, metaFields, readMeta, type MessageMeta } from "../envelope/envelope.ts";
import { fsyncDir, unlinkIfExists, writeFileAtomic } from "../store/fsync-dir.ts";

/** The file ending of today's format, and of the first versions' by QoS. */
const SUFFIX = ".rmsg";
const LEGACY = { ".retained": 0, ".retained1": 1 } as const;

/** A retained message. */
export interface Retained {
  payload: Uint8Array;
  qos: 0 | 1 | 2;
  /** Its MQTT 5 properties as stored; null when it had none. */
  meta: MessageMeta | null;
}

function fileOf(name: string): { channel: string; legacyQos: 0 | 1 | null } | null {
  if (name.endsWith(SUFFIX)) return { channel: name.slice(0, -SUFFIX.length), legacyQos: null };
  for (const [suffix, qos] of Object.entries(LEGACY)) if (name.endsWith(suffix)) return { channel: name.slice(0, -suffix.length), legacyQos: qos };
  return null;
}

function parse(bytes: Uint8Array, legacyQos: 0 | 1 | null): Retained | null {
  if (legacyQos !== null) return { payload: new Uint8Array(bytes), qos: legacyQos, meta: null };
  const raw = decodeValue(bytes) as Record<string, unknown> | null;
  if (!raw || typeof raw !== "object" || !(raw.payload instanceof Uint8Array)) return null;
  const meta: MessageMeta = {};
  readMeta(raw, meta);
  delete meta.qos; // the file's own qos field, read below
  const qos = raw.qos === 2 ? 2 : raw.qos === 1 ? 1 : 0;
  return { payload: raw.payload, qos, meta: Object.keys(meta).length > 0 ? meta : null };
}

/** The retained messages of one data directory. */
export class RetainedStore {
  private readonly dir: string;
  private readonly byChannel = new Map<string, Retained>();
  /** Writes one after another, so the last retained publish of a channel is the one kept. */
  private chain: Promise<void> = Promise.resolve();

  private constructor(dir: string) {
    this.dir = dir;
  }

  /** Loads every retained message under `dir` (created if missing). */
  static async open(dir: string, now = Date.now()): Promise<RetainedStore> {
    await mkdir(dir, { recursive: true });
    const s = new RetainedStore(dir);
    const seen = new Map<string, { mtime: number; file: string; current: boolean }>();
    for (const f of await readdir(dir)) {
      if (f.endsWith(".tmp")) {
        await unlinkIfExists(join(dir, f)); // a write that never reached its rename
        continue;
      }
      const which = fileOf(f);
      if (!which) continue;
      const mtime = (await stat(join(dir, f))).mtimeMs;
      const current = which.legacyQos === null;
      const other = seen.get(which.channel);
      // Two there: a crash between writing one and removing the other. The newer one stands.
      if (other && (other.mtime > mtime || (other.mtime === mtime && other.current))) {
        await unlinkIfExists(join(dir, f));
        continue;
      }
      if (other) await unlinkIfExists(join(dir, other.file));
      const r = parse(await readFile(join(dir, f)), which.legacyQos);
      if (!r || (r.meta?.expires !== undefined && r.meta.expires <= now)) {
        // Unreadable, or expired while keyop was down: gone, as it would have gone had keyop run.
        await unlinkIfExists(join(dir, f));
        continue;
      }
      seen.set(which.channel, { mtime, file: f, current });
      s.byChannel.set(which.channel, r);
    }
    return s;
  }

  /**
   * Keeps `payload` as the channel's retained message, published at `qos`
   * with `meta` (an empty payload clears it); resolves once durable.
   */
  set(channel: string, payload: Uint8Array, qos: number, meta: MessageMeta | null = null): Promise<void> {
    const q: 0 | 1 | 2 = qos >= 2 ? 2 : qos >= 1 ? 1 : 0;
    const task = this.chain.then(async () => {
      const path = join(this.dir, channel + SUFFIX);
      const legacy = Object.keys(LEGACY).map((suffix) => join(this.dir, channel + suffix));
      if (payload.length === 0) {
        this.byChannel.delete(channel);
        await unlinkIfExists(path);
      } else {
        const m = meta && Object.keys(meta).length > 0 ? meta : null;
        await writeFileAtomic(path, encodeValue({ qos: q, payload: new Uint8Array(payload), ...(m ? metaFields(m) : {}) }), null);
        this.byChannel.set(channel, { payload: new Uint8Array(payload), qos: q, meta: m });
      }
      for (const l of legacy) await unlinkIfExists(l);
      await fsyncDir(this.dir);
    });
    // The caller gets the error through `task`; the chain only keeps the order of writes.
    this.chain = task.catch(() => undefined);
    return task;
  }

  /** Retained messages of the channels `matches` accepts that have not expired by `now`. */
  matching(matches: (channel: string) => boolean, now = Date.now()): [string, Retained][] {
    const out: [string, Retained][] = [];
    for (const [c, r] of this.byChannel) {
      if (r.meta?.expires !== undefined && r.meta.expires <= now) {
        // Expired: no longer delivered; its file goes at the next set of the channel or start.
        this.byChannel.delete(c);
        continue;
      }
      if (matches(c)) out.push([c, r]);
    }
    return out;
  }
}
