/**
 * MQTT retained messages: the last retained payload of each channel and
 * the QoS it was published with, kept durably in `<data_dir>/mqtt-retained/`
 * (one file per channel, `<channel>.retained` for QoS 0 and
 * `<channel>.retained1` for QoS 1 and 2, replaced atomically: temp file,
 * fsync, rename, directory fsync) and held in memory for new
 * subscriptions. An empty retained payload clears the channel's.
 *
 * The QoS is kept because a new subscription gets the retained message at
 * the lower of it and the subscription's QoS, as MQTT asks: a retained
 * QoS 1 "device offline" must reach a QoS 1 subscriber acknowledged, not
 * as fire-and-forget.
 */
import { mkdir, readdir, readFile, stat } from "node:fs/promises";
import { join } from "node:path";
import { fsyncDir, unlinkIfExists, writeFileAtomic } from "../store/fsync-dir.ts";

/** File name endings by stored QoS (the QoS 0 one is also what the first version wrote). */
const SUFFIX = { 0: ".retained", 1: ".retained1" } as const;

/** A retained message. */
export interface Retained {
  payload: Uint8Array;
  /** 0, or 1 for a message published at QoS 1 or 2 (keyop delivers QoS 2 as 1). */
  qos: 0 | 1;
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
  static async open(dir: string): Promise<RetainedStore> {
    await mkdir(dir, { recursive: true });
    const s = new RetainedStore(dir);
    const seen = new Map<string, { qos: 0 | 1; mtime: number; file: string }>();
    for (const f of await readdir(dir)) {
      if (f.endsWith(".tmp")) {
        await unlinkIfExists(join(dir, f)); // a write that never reached its rename
        continue;
      }
      const qos = f.endsWith(SUFFIX[1]) ? 1 : f.endsWith(SUFFIX[0]) ? 0 : undefined;
      if (qos === undefined) continue;
      const channel = f.slice(0, -SUFFIX[qos].length);
      const mtime = (await stat(join(dir, f))).mtimeMs;
      const other = seen.get(channel);
      // Both there: a crash between writing one and removing the other. The newer one stands.
      if (other && (other.mtime > mtime || (other.mtime === mtime && other.qos === 1))) {
        await unlinkIfExists(join(dir, f));
        continue;
      }
      if (other) await unlinkIfExists(join(dir, other.file));
      seen.set(channel, { qos, mtime, file: f });
      s.byChannel.set(channel, { payload: new Uint8Array(await readFile(join(dir, f))), qos });
    }
    return s;
  }

  /**
   * Keeps `payload` as the channel's retained message, published at `qos`
   * (empty: clears it); resolves once durable.
   */
  set(channel: string, payload: Uint8Array, qos: number): Promise<void> {
    const q: 0 | 1 = qos >= 1 ? 1 : 0;
    const task = this.chain.then(async () => {
      const path = join(this.dir, channel + SUFFIX[q]);
      const other = join(this.dir, channel + SUFFIX[q === 1 ? 0 : 1]);
      if (payload.length === 0) {
        this.byChannel.delete(channel);
        await unlinkIfExists(path);
        await unlinkIfExists(other);
      } else {
        await writeFileAtomic(path, payload, null);
        this.byChannel.set(channel, { payload: new Uint8Array(payload), qos: q });
        await unlinkIfExists(other);
      }
      await fsyncDir(this.dir);
    });
    // The caller gets the error through `task`; the chain only keeps the order of writes.
    this.chain = task.catch(() => undefined);
    return task;
  }

  /** Retained messages of the channels `matches` accepts. */
  matching(matches: (channel: string) => boolean): [string, Retained][] {
    return [...this.byChannel].filter(([c]) => matches(c));
  }
}
