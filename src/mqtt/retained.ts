/**
 * MQTT retained messages: the last retained payload of each channel, kept
 * durably in `<data_dir>/mqtt-retained/` (one file per channel, replaced
 * atomically: temp file, fsync, rename, directory fsync) and held in memory
 * for new subscriptions. An empty retained payload clears the channel's.
 */
import { mkdir, open, readdir, readFile, rename, unlink } from "node:fs/promises";
import { join } from "node:path";
import { fsyncDir } from "../store/fsync-dir.ts";

const SUFFIX = ".retained";

/** The retained messages of one data directory. */
export class RetainedStore {
  private readonly dir: string;
  private readonly byChannel = new Map<string, Uint8Array>();
  /** Writes one after another, so the last retained publish of a channel is the one kept. */
  private chain: Promise<void> = Promise.resolve();

  private constructor(dir: string) {
    this.dir = dir;
  }

  /** Loads every retained message under `dir` (created if missing). */
  static async open(dir: string): Promise<RetainedStore> {
    await mkdir(dir, { recursive: true });
    const s = new RetainedStore(dir);
    for (const f of await readdir(dir)) {
      if (f.endsWith(".tmp")) await unlink(join(dir, f)).catch(() => {});
      else if (f.endsWith(SUFFIX)) s.byChannel.set(f.slice(0, -SUFFIX.length), new Uint8Array(await readFile(join(dir, f))));
    }
    return s;
  }

  /** Keeps `payload` as the channel's retained message (empty: clears it); resolves once durable. */
  set(channel: string, payload: Uint8Array): Promise<void> {
    const task = this.chain.then(async () => {
      const path = join(this.dir, channel + SUFFIX);
      if (payload.length === 0) {
        this.byChannel.delete(channel);
        await unlink(path).catch(() => {});
      } else {
        const fh = await open(path + ".tmp", "w");
        try {
          await fh.writeFile(payload);
          await fh.datasync();
        } finally {
          await fh.close();
        }
        await rename(path + ".tmp", path);
        this.byChannel.set(channel, new Uint8Array(payload));
      }
      await fsyncDir(this.dir);
    });
    this.chain = task.catch(() => {});
    return task;
  }

  /** Retained messages of the channels `matches` accepts. */
  matching(matches: (channel: string) => boolean): [string, Uint8Array][] {
    return [...this.byChannel].filter(([c]) => matches(c));
  }
}
