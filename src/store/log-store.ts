/**
 * The data directory: the lock, and one ChannelLog per channel directory.
 *
 *   <data_dir>/LOCK                      flock held while a process owns it
 *   <data_dir>/channels/<channel>/*.log  segments (docs/storage.md)
 *   <data_dir>/subscribers/*.json        cursors (cursor-store.ts)
 */
import { mkdir, readdir } from "node:fs/promises";
import { join } from "node:path";
import { Scratch } from "../bytes.ts";
import { assertChannel, channelProblem } from "../envelope/names.ts";
import { ioErrorFrom } from "../errors.ts";
import { ChannelLog, type ChannelLogOptions } from "./channel-log.ts";
import { lockDataDir, type DirLock } from "./lock.ts";

/** How the store opens its logs. */
export interface LogStoreOptions extends ChannelLogOptions {
  /** Segment size of one channel, when not `segmentBytes` (a channel with a bound on its bytes). */
  segmentBytesFor?: (channel: string) => number;
}

/** Called once for every channel created after open. */
export type ChannelCreatedListener = (log: ChannelLog) => void;

/** All channel logs of one data directory. */
export class LogStore {
  readonly dataDir: string;
  readonly channelsDir: string;
  private readonly opts: LogStoreOptions;
  private readonly logs = new Map<string, ChannelLog>();
  private readonly creating = new Map<string, Promise<ChannelLog>>();
  private readonly createdListeners = new Set<ChannelCreatedListener>();
  private readonly lock: DirLock;

  private constructor(dataDir: string, opts: LogStoreOptions, lock: DirLock) {
    this.dataDir = dataDir;
    this.channelsDir = join(dataDir, "channels");
    // One buffer for the record writes of every log: they run one at a time on this thread.
    this.opts = opts.scratch ? opts : { ...opts, scratch: new Scratch() };
    this.lock = lock;
  }

  /** Locks `dataDir` (throws `LockedError` if taken) and opens every channel. */
  static async open(dataDir: string, opts: LogStoreOptions): Promise<LogStore> {
    await mkdir(join(dataDir, "channels"), { recursive: true });
    const lock = lockDataDir(dataDir);
    const store = new LogStore(dataDir, opts, lock);
    try {
      for (const name of await readdir(store.channelsDir)) {
        const problem = channelProblem(name);
        if (problem) {
          opts.logger.warn("ignoring directory that is not a channel", { dir: join(store.channelsDir, name), reason: problem });
          continue;
        }
        store.logs.set(name, await ChannelLog.open(name, join(store.channelsDir, name), store.optsFor(name)));
      }
    } catch (err) {
      await store.close();
      throw err;
    }
    return store;
  }

  private optsFor(channel: string): ChannelLogOptions {
    const seg = this.opts.segmentBytesFor?.(channel);
    return seg === undefined || seg === this.opts.segmentBytes ? this.opts : { ...this.opts, segmentBytes: seg };
  }

  /** The log of `channel` if it exists. */
  get(channel: string): ChannelLog | undefined {
    return this.logs.get(channel);
  }

  /** The log of `channel`, created (directory, first segment) if needed. */
  getOrCreate(channel: string): ChannelLog | Promise<ChannelLog> {
    const log = this.logs.get(channel);
    if (log) return log;
    assertChannel(channel);
    let p = this.creating.get(channel);
    if (!p) {
      p = ChannelLog.open(channel, join(this.channelsDir, channel), this.optsFor(channel), { create: true }).then(
        (created) => {
          this.logs.set(channel, created);
          this.creating.delete(channel);
          for (const l of this.createdListeners) l(created);
          return created;
        },
        (err) => {
          this.creating.delete(channel);
          throw ioErrorFrom(err, `create channel ${channel}`);
        },
      );
      this.creating.set(channel, p);
    }
    return p;
  }

  /** Every open channel log. */
  all(): ChannelLog[] {
    return [...this.logs.values()];
  }

  /** Registers a listener for channels created from now on. */
  onChannelCreated(fn: ChannelCreatedListener): () => void {
    this.createdListeners.add(fn);
    return () => this.createdListeners.delete(fn);
  }

  /** Closes every log (draining queued appends) and releases the lock. */
  async close(): Promise<void> {
    await Promise.allSettled([...this.creating.values()]);
    await Promise.all([...this.logs.values()].map((l) => l.close()));
    this.lock.release();
  }
}
