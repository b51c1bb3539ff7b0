/**
 * One reader per stream per hub for the boards that are caught up: a board
 * reads its backlog through a consumer of its own, and once it has reached
 * the end of what is stored it leaves that consumer and takes its messages
 * from the hub's live feed instead. Idle boards then cost the cluster no
 * consumer at all (a consumer per board costs memory on every server).
 *
 * A tap is registered before a board's catch-up begins and holds what the
 * feed delivers meanwhile, so that nothing stored between the end of the
 * catch-up and the switch is missed; a tap that overflows (a slow board)
 * is dropped, and the board reads from its own consumer again.
 */
import type { StreamMessage } from "./foreign.ts";
import { subjectMatcher } from "./subjects.ts";

/** What a tap holds for a board: messages matching its subject filter, in stream order, from `from` on. */
export class Tap {
  /** The first stream sequence this tap is sure to hold (if it matches). */
  readonly from: number;
  readonly subject: string;
  readonly matches: (subject: string) => boolean;
  private readonly limit: number;
  private queue: StreamMessage[] = [];
  private head = 0;
  private wake: (() => void) | null = null;
  /** More arrived than `limit` before they were taken: the board must read from its own consumer. */
  overflowed = false;
  closed = false;
  private readonly detach: (t: Tap) => void;

  constructor(subject: string, from: number, limit: number, detach: (t: Tap) => void) {
    this.subject = subject;
    this.matches = subjectMatcher(subject);
    this.from = from;
    this.limit = limit;
    this.detach = detach;
  }

  /** @internal The feed delivers a message matching the tap. */
  push(m: StreamMessage): void {
    if (this.closed || this.overflowed) return;
    if (this.queue.length - this.head >= this.limit) {
      this.overflowed = true;
      this.queue = [];
      this.head = 0;
    } else this.queue.push(m);
    this.wake?.();
  }

  /** The next message, or null once overflowed or ended. */
  async next(): Promise<StreamMessage | null> {
    while (!this.overflowed && !this.closed) {
      if (this.head < this.queue.length) {
        const m = this.queue[this.head++]!;
        if (this.head > 1024 && this.head * 2 > this.queue.length) {
          this.queue = this.queue.slice(this.head);
          this.head = 0;
        }
        return m;
      }
      await new Promise<void>((resolve) => {
        this.wake = resolve;
      });
      this.wake = null;
    }
    return null;
  }

  /** @internal Ends the tap (the feed stopped, or the reader left). */
  end(): void {
    this.closed = true;
    this.wake?.();
  }

  close(): void {
    this.end();
    this.detach(this);
  }
}

/**
 * Taps by subject filter: a message is offered to the taps whose filter is
 * the subject itself or one of its `prefix.>` forms (a board's
 * `cmd.board-7.>`), found by lookup; filters with `*` are matched one by
 * one. Fan-out stays cheap with many thousands of boards.
 */
export class LiveFeed {
  /** Last stream sequence delivered (the feed starts after the stream's last message when it is made). */
  delivered: number;
  private readonly byFilter = new Map<string, Set<Tap>>();
  private readonly scanned = new Set<Tap>();
  private readonly limit: number;
  private ended = false;

  constructor(startAfter: number, limit: number) {
    this.delivered = startAfter;
    this.limit = limit;
  }

  /** A tap for `subject`, sure to hold every matching message from the next one this feed delivers. */
  tap(subject: string): Tap {
    const t = new Tap(subject, this.delivered + 1, this.limit, (x) => this.remove(x));
    if (this.ended) t.end();
    else if (subject.includes("*")) this.scanned.add(t);
    else {
      let set = this.byFilter.get(subject);
      if (!set) {
        set = new Set();
        this.byFilter.set(subject, set);
      }
      set.add(t);
    }
    return t;
  }

  /** Taps open now. */
  get taps(): number {
    let n = this.scanned.size;
    for (const s of this.byFilter.values()) n += s.size;
    return n;
  }

  /** The feed's consumer delivers `m` (in stream order). */
  deliver(m: StreamMessage): void {
    this.delivered = m.seq;
    const tokens = m.subject.split(".");
    const exact = this.byFilter.get(m.subject);
    if (exact) for (const t of exact) t.push(m);
    let prefix = "";
    for (let k = 0; k < tokens.length; k++) {
      prefix = k === 0 ? tokens[0]! : `${prefix}.${tokens[k]}`;
      if (k === tokens.length - 1) break;
      const wide = this.byFilter.get(`${prefix}.>`);
      if (wide) for (const t of wide) t.push(m);
    }
    if (tokens.length > 0) {
      const all = this.byFilter.get(">");
      if (all) for (const t of all) t.push(m);
    }
    for (const t of this.scanned) if (t.matches(m.subject)) t.push(m);
  }

  /** The feed's consumer stopped: every tap ends, its readers go back to their own consumers. */
  end(): void {
    this.ended = true;
    for (const s of this.byFilter.values()) for (const t of s) t.end();
    for (const t of this.scanned) t.end();
    this.byFilter.clear();
    this.scanned.clear();
  }

  get isEnded(): boolean {
    return this.ended;
  }

  private remove(t: Tap): void {
    if (this.scanned.delete(t)) return;
    const set = this.byFilter.get(t.subject);
    set?.delete(t);
    if (set?.size === 0) this.byFilter.delete(t.subject);
  }
}
