/**
 * What keyop has sent to each persistent MQTT session: per client id and
 * channel, the highest seq sent. A QoS 1 message sent again must carry
 * DUP (MQTT: "MUST be set to 1 when it attempts to re-deliver"), and one
 * sent for the first time must not, also across a keyop restart.
 *
 * The marks live in memory and are saved to
 * `<data_dir>/mqtt-sessions/sent-marks.json` every second while they
 * change and at a clean stop, then marked clean. After a crash the file
 * may lag behind what went out, so until the client has been served again
 * every message that was already in the log when keyop started counts as
 * maybe sent (DUP set): on a crash the rule leans to saying "maybe again",
 * which a receiver handles, rather than hiding a redelivery.
 */
import { mkdir, open, readFile, rename } from "node:fs/promises";
import { join } from "node:path";
import { fsyncDir } from "../store/fsync-dir.ts";

const FILE = "sent-marks.json";
const SAVE_EVERY_MS = 1000;

interface Saved {
  clean: boolean;
  marks: Record<string, Record<string, number>>;
}

/** Sent marks of the persistent MQTT sessions of one data directory. */
export class SentMarks {
  private readonly dir: string;
  private readonly byClient = new Map<string, Map<string, number>>();
  /** Set after a crash: per channel, the last seq in the log when keyop started. */
  private readonly crashFloor: ((channel: string) => number) | null;
  private dirty = false;
  private timer: ReturnType<typeof setInterval> | null = null;
  private saving: Promise<void> = Promise.resolve();

  private constructor(dir: string, crashFloor: ((channel: string) => number) | null) {
    this.dir = dir;
    this.crashFloor = crashFloor;
  }

  /**
   * Loads the marks under `dir`. `lastSeqAtStart` holds the last seq stored
   * in each channel now, before any client is served; it is used when the
   * previous run did not stop cleanly.
   */
  static async open(dir: string, lastSeqAtStart: ReadonlyMap<string, number>): Promise<SentMarks> {
    await mkdir(dir, { recursive: true });
    let saved: Saved | null = null;
    let existed = false;
    try {
      saved = JSON.parse(await readFile(join(dir, FILE), "utf8")) as Saved;
      existed = true;
    } catch (err) {
      existed = (err as NodeJS.ErrnoException).code !== "ENOENT";
    }
    // No file at all: no persistent session was ever served here. A file that is unreadable or
    // not marked clean: the run before did not end cleanly.
    const crashed = existed && saved?.clean !== true;
    const m = new SentMarks(dir, crashed ? (channel) => lastSeqAtStart.get(channel) ?? 0 : null);
    for (const [client, chans] of Object.entries(saved?.marks ?? {})) {
      m.byClient.set(client, new Map(Object.entries(chans).filter(([, s]) => Number.isSafeInteger(s))));
    }
    // From now on the file on disk is not clean until the next clean close.
    await m.save(false);
    m.timer = setInterval(() => {
      if (m.dirty) void m.save(false).catch(() => {});
    }, SAVE_EVERY_MS);
    m.timer.unref?.();
    return m;
  }

  /** Whether `seq` of `channel` may have been sent to `client` before (the DUP flag). */
  sentBefore(client: string, channel: string, seq: number): boolean {
    if ((this.byClient.get(client)?.get(channel) ?? 0) >= seq) return true;
    return this.crashFloor !== null && seq <= this.crashFloor(channel);
  }

  /** Notes that `seq` of `channel` goes to `client` now. */
  sending(client: string, channel: string, seq: number): void {
    let chans = this.byClient.get(client);
    if (!chans) this.byClient.set(client, (chans = new Map()));
    if ((chans.get(channel) ?? 0) < seq) {
      chans.set(channel, seq);
      this.dirty = true;
    }
  }

  /** Forgets a client id (its session was dropped: a clean start or an unsubscribe of everything). */
  forget(client: string): void {
    if (this.byClient.delete(client)) this.dirty = true;
  }

  /** Saves the marks and marks the file clean: the next start knows them exactly. */
  async close(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.save(true);
  }

  private save(clean: boolean): Promise<void> {
    this.dirty = false;
    const body: Saved = { clean, marks: {} };
    for (const [client, chans] of this.byClient) body.marks[client] = Object.fromEntries(chans);
    const text = JSON.stringify(body);
    const task = this.saving.then(async () => {
      const path = join(this.dir, FILE);
      const fh = await open(`${path}.tmp`, "w");
      try {
        await fh.writeFile(text);
        await fh.datasync();
      } finally {
        await fh.close();
      }
      await rename(`${path}.tmp`, path);
      await fsyncDir(this.dir);
    });
    this.saving = task.catch(() => {});
    return task;
  }
}
