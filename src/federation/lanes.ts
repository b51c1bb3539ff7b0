/**
 * The order in which a link's BATCH frames go out: one queue per priority
 * lane, shared by weight (start-time fair queueing by wire bytes: each
 * frame is tagged with its lane's virtual finish time, the smallest goes
 * next), and an optional token bucket that holds frames back to the link's
 * byte rate. Only data goes through here: ACKs, heartbeats and CLOSE are
 * written directly, so a cap or a backlog never delays them.
 *
 * With nothing queued, no cap and a writable session, a frame goes straight
 * to the session: a link without priorities or a cap behaves as if this
 * were not here.
 */
import { laneWeight } from "./priority.ts";
import type { TokenBucket } from "./token-bucket.ts";

/** Where frames go: a session. */
export interface LaneOutput {
  /**
   * Queues a frame for the end of the turn, or with `now` writes it in the
   * call (after what is queued); false when the caller should wait for
   * `writable()` before more.
   */
  send(frame: Uint8Array, now?: boolean): boolean;
  writable(): Promise<void>;
}

/** Timers, injectable for tests. */
export interface LaneClock {
  now(): number;
  setTimer(fn: () => void, ms: number): unknown;
  clearTimer(t: unknown): void;
}

const realClock: LaneClock = {
  now: () => performance.now(),
  setTimer: (fn, ms) => setTimeout(fn, ms),
  clearTimer: (t) => clearTimeout(t as ReturnType<typeof setTimeout>),
};

/** One lane's figures, for status and metrics. */
export interface LaneStats {
  priority: number;
  /** Frames waiting in the lane now. */
  queuedFrames: number;
  queuedBytes: number;
  /** Frames and wire bytes written since the session opened. */
  sentFrames: number;
  sentBytes: number;
}

class Lane {
  readonly priority: number;
  readonly weight: number;
  frames: Uint8Array[] = [];
  /** Each queued frame's virtual finish time, given when it was queued. */
  tags: number[] = [];
  head = 0;
  /** Virtual finish time of the lane's last frame queued or written. */
  finish = 0;
  queuedBytes = 0;
  sentFrames = 0;
  sentBytes = 0;

  constructor(priority: number) {
    this.priority = priority;
    this.weight = laneWeight(priority);
  }

  get empty(): boolean {
    return this.head >= this.frames.length;
  }

  shift(): Uint8Array {
    const f = this.frames[this.head++]!;
    if (this.head > 64 && this.head * 2 > this.frames.length) {
      this.frames = this.frames.slice(this.head);
      this.tags = this.tags.slice(this.head);
      this.head = 0;
    }
    return f;
  }
}

const RESOLVED = Promise.resolve();

/** The data frames of one session, by lane. */
export class LaneScheduler {
  private readonly out: LaneOutput;
  private readonly bucket: TokenBucket | undefined;
  private readonly clock: LaneClock;
  private readonly lanes = new Map<number, Lane>();
  /** Lanes by priority, for a stable order of ties. */
  private ordered: Lane[] = [];
  private virtual = 0;
  private queued = 0;
  private waitingWritable = false;
  private timer: unknown = null;
  private stopped = false;
  private idleWaiters: (() => void)[] = [];

  constructor(out: LaneOutput, opts: { bucket?: TokenBucket | undefined; clock?: LaneClock } = {}) {
    this.out = out;
    this.bucket = opts.bucket;
    this.clock = opts.clock ?? realClock;
  }

  /**
   * Queues a data frame in lane `priority`; handed to the session at once
   * when nothing waits, and then with `now` written in the call rather than
   * at the end of the turn.
   */
  push(priority: number, frame: Uint8Array, now = false): void {
    if (this.stopped) return;
    const lane = this.lane(priority);
    // A lane that was idle starts at the current virtual time; a busy one after its last frame.
    lane.finish = Math.max(lane.finish, this.virtual) + frame.length / lane.weight;
    if (this.queued === 0 && !this.waitingWritable && this.timer === null && (!this.bucket || this.bucket.waitMs(this.clock.now()) === 0)) {
      this.virtual = lane.finish - frame.length / lane.weight;
      this.write(lane, frame, now);
      return;
    }
    lane.frames.push(frame);
    lane.tags.push(lane.finish);
    lane.queuedBytes += frame.length;
    this.queued++;
    this.pump();
  }

  /** Resolves once nothing is queued and the session takes more: the time to fetch the next batches. */
  idle(): Promise<void> {
    if (this.stopped || (this.queued === 0 && !this.waitingWritable)) return RESOLVED;
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** Something is queued or the session does not take more now: `idle()` would wait. */
  get busy(): boolean {
    return !this.stopped && (this.queued > 0 || this.waitingWritable);
  }

  /** Frames waiting, over all lanes. */
  get queuedFrames(): number {
    return this.queued;
  }

  /** Per lane, by priority. */
  stats(): LaneStats[] {
    return this.ordered.map((l) => ({ priority: l.priority, queuedFrames: l.frames.length - l.head, queuedBytes: l.queuedBytes, sentFrames: l.sentFrames, sentBytes: l.sentBytes }));
  }

  /** Drops what is queued (the session ended: those batches are sent again by the next one). */
  stop(): void {
    this.stopped = true;
    if (this.timer !== null) this.clock.clearTimer(this.timer);
    this.timer = null;
    for (const l of this.ordered) {
      l.frames = [];
      l.tags = [];
      l.head = 0;
      l.queuedBytes = 0;
    }
    this.queued = 0;
    this.wakeIdle();
  }

  private lane(priority: number): Lane {
    let lane = this.lanes.get(priority);
    if (!lane) {
      lane = new Lane(priority);
      this.lanes.set(priority, lane);
      this.ordered = [...this.lanes.values()].sort((a, b) => a.priority - b.priority);
    }
    return lane;
  }

  private write(lane: Lane, frame: Uint8Array, now = false): void {
    lane.sentFrames++;
    lane.sentBytes += frame.length;
    this.bucket?.take(frame.length, this.clock.now());
    if (!this.out.send(frame, now)) {
      this.waitingWritable = true;
      void this.out.writable().then(this.onWritable);
    }
  }

  private readonly onWritable = (): void => {
    this.waitingWritable = false;
    this.pump();
  };

  private readonly onTimer = (): void => {
    this.timer = null;
    this.pump();
  };

  private pump(): void {
    while (!this.stopped && this.queued > 0 && !this.waitingWritable && this.timer === null) {
      if (this.bucket) {
        const wait = this.bucket.waitMs(this.clock.now());
        if (wait > 0) {
          this.timer = this.clock.setTimer(this.onTimer, Math.max(1, Math.ceil(wait)));
          return;
        }
      }
      // The frame with the smallest virtual finish time goes next (ties: the higher lane).
      let best: Lane | null = null;
      let bestFinish = Number.POSITIVE_INFINITY;
      for (const l of this.ordered) {
        if (l.empty) continue;
        const f = l.tags[l.head]!;
        if (f < bestFinish) {
          best = l;
          bestFinish = f;
        }
      }
      const lane = best!;
      const frame = lane.shift();
      lane.queuedBytes -= frame.length;
      this.queued--;
      // The virtual clock follows the start tag of what is being sent.
      this.virtual = bestFinish - frame.length / lane.weight;
      this.write(lane, frame);
    }
    if (this.queued === 0 && !this.waitingWritable) this.wakeIdle();
  }

  private wakeIdle(): void {
    const w = this.idleWaiters;
    if (w.length === 0) return;
    this.idleWaiters = [];
    for (const fn of w) fn();
  }
}
