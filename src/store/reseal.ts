/**
 * Going back to the last offset known durable after a failed fdatasync:
 * the active segment is sealed there and a fresh segment starts at the next
 * seq (or, when nothing of the active one is durable, it starts over). The
 * fresh segment takes the carried records and a probe of zeros, written and
 * fdatasynced on handles opened after the failure: that success, and only
 * that, vouches for it. Throws if the disk refuses any step; the segments
 * are then as they were.
 */
import { open, unlink } from "node:fs/promises";
import { writeSync } from "node:fs";
import { uninitialized } from "../bytes.ts";
import type { Logger } from "../observability/logger.ts";
import { fsyncDir } from "./fsync-dir.ts";
import { RECORD_HEADER_BYTES, type RawRecord, writeRecord } from "./record.ts";
import { Segment } from "./segment.ts";

/** Zeros written and fdatasynced to prove a fresh segment takes writes. */
const PROBE_BYTES = 4096;

/** Where the log stands when it goes back. */
export interface ResealInput {
  channel: string;
  dir: string;
  active: Segment;
  /** Bytes of the active segment known to be on the disk, and the seq after them. */
  durableEnd: number;
  durableSeq: number;
  nextSeq: number;
  /** Committed records past the durable end (sync: interval), to be written again. */
  carried: RawRecord[];
  /** Called with a fresh segment before it is used (damage reporting). */
  watch(seg: Segment): void;
  logger: Logger;
}

/** The segment to go on in (the active one itself when it started over), and its written end. */
export async function sealAtDurableEnd(i: ResealInput): Promise<{ fresh: Segment; end: number }> {
  const { active } = i;
  if (i.durableEnd === 0) {
    await active.reopen();
    await (await active.handle()).truncate(0);
    active.cutAt(0, active.baseSeq - 1);
    return { fresh: active, end: await probe(active, i) };
  }
  const sealer = await open(active.path, "r+");
  try {
    await sealer.truncate(i.durableEnd);
    await sealer.datasync();
  } finally {
    await sealer.close();
  }
  active.cutAt(i.durableEnd, i.durableSeq - 1);
  active.maxSeq = i.durableSeq - 1;
  await active.reopen();
  const fresh = new Segment(i.dir, i.durableSeq, 0, i.durableSeq - 1, Date.now());
  i.watch(fresh);
  fresh.adopt(await open(fresh.path, "w+"));
  try {
    await fsyncDir(i.dir);
    return { fresh, end: await probe(fresh, i) };
  } catch (err) {
    // Not used: its handles closed (a handle left to the collector ends the process) and its
    // file removed; the next attempt makes it again.
    await fresh.close();
    await unlink(fresh.path).catch((e) => i.logger.warn("could not remove an unused segment", { channel: i.channel, segment: fresh.path, error: String(e) }));
    throw err;
  }
}

/** Writes the carried records and zeros into `fresh` and fdatasyncs them; returns the end of the records. */
async function probe(fresh: Segment, i: ResealInput): Promise<number> {
  const { carried } = i;
  let total = PROBE_BYTES;
  for (const r of carried) total += RECORD_HEADER_BYTES + r.body.length;
  const buf = uninitialized(total);
  let end = 0;
  const offsets: number[] = [];
  for (const r of carried) {
    offsets.push(end);
    end = writeRecord(buf, end, r.seq, r.body);
  }
  buf.fill(0, end);
  const fh = await fresh.handle();
  let done = 0;
  while (done < buf.length) done += writeSync(fh.fd, buf, done, buf.length - done, done);
  const sfh = await fresh.syncHandle();
  try {
    await sfh.datasync();
  } finally {
    fresh.releaseSyncHandle(sfh);
  }
  for (let k = 0; k < carried.length; k++) fresh.noteAppended(carried[k]!.seq, offsets[k]!);
  fresh.size = end;
  fresh.allocated = buf.length;
  fresh.lastSeq = i.nextSeq - 1;
  fresh.lastWriteMs = Date.now();
  return end;
}
