import { describe, expect, test } from "bun:test";
import { mkdirSync, readdirSync, readFileSync, statSync, truncateSync, writeFileSync, appendFileSync } from "node:fs";
import { join } from "node:path";
import { Scratch } from "../../src/bytes.ts";
import { ChannelLog, type ChannelLogOptions } from "../../src/store/channel-log.ts";
import { RECORD_HEADER_BYTES, scanRecords } from "../../src/store/record.ts";
import { createLogger, silentLogger, type Logger } from "../../src/observability/logger.ts";
import { tmpDir, waitFor } from "../helpers.ts";

const opts = (o: Partial<ChannelLogOptions> = {}): ChannelLogOptions => ({
  segmentBytes: 64 * 1024 * 1024,
  sync: "always",
  syncIntervalMs: 50,
  tailCacheBytes: 1 << 20,
  logger: silentLogger,
  ...o,
});
const enc = new TextEncoder();
const dec = new TextDecoder();
const bodyOf = (i: number, pad = 0) => enc.encode(`record-${i}` + "x".repeat(pad));

async function readAll(log: ChannelLog, from = log.firstSeq): Promise<{ seq: number; text: string }[]> {
  const out: { seq: number; text: string }[] = [];
  let next = from;
  while (true) {
    const got = await log.read(next, 100);
    if (got.length === 0) return out;
    for (const r of got) out.push({ seq: r.seq, text: dec.decode(r.body) });
    next = got[got.length - 1]!.seq + 1;
  }
}

function capture(): { logger: Logger; lines: string[] } {
  const lines: string[] = [];
  return { logger: createLogger({ level: "debug", write: (l) => lines.push(l) }), lines };
}

describe("ChannelLog", () => {
  test("readNow: the tail from memory, [] when there is nothing new, null when the records are only on disk", async () => {
    const dir = join(tmpDir(), "c");
    const log = await ChannelLog.open("c", dir, opts({ sync: "none", tailCacheBytes: 200 }), { create: true });
    const off = log.onCommit(() => {}); // a watched log keeps its tail in memory
    for (let i = 0; i < 20; i++) await log.append(bodyOf(i, 20));
    expect(log.readNow(21)).toEqual([]);
    const tail = log.readNow(20)!;
    expect(tail.map((r) => [r.seq, dec.decode(r.body)])).toEqual([[20, `record-19${"x".repeat(20)}`]]);
    // The cache holds about 200 bytes: the first records left it, and only `read` has them.
    expect(log.readNow(1)).toBeNull();
    expect((await log.read(1, 1)).map((r) => r.seq)).toEqual([1]);
    off();
    await log.close();
  });

  test("appends get consecutive seqs starting at 1 and read back intact", async () => {
    const dir = join(tmpDir(), "c");
    const log = await ChannelLog.open("c", dir, opts(), { create: true });
    expect(log.firstSeq).toBe(1);
    expect(log.nextSeq).toBe(1);
    const seqs = await Promise.all(Array.from({ length: 50 }, (_, i) => log.append(bodyOf(i))));
    expect(seqs).toEqual(Array.from({ length: 50 }, (_, i) => i + 1));
    const all = await readAll(log);
    expect(all.map((r) => r.text)).toEqual(Array.from({ length: 50 }, (_, i) => `record-${i}`));
    await log.close();
  });

  test.each(["none", "always", "interval"] as const)("two logs sharing one scratch buffer, writes interleaved and across its limit, read back intact from disk (sync %s)", async (sync) => {
    const root = tmpDir();
    const scratch = new Scratch(4096);
    const o = opts({ sync, scratch, tailCacheBytes: 0 });
    const logs = [await ChannelLog.open("a", join(root, "a"), o, { create: true }), await ChannelLog.open("b", join(root, "b"), o, { create: true })];
    const want: string[][] = [[], []];
    const pending: Promise<unknown>[] = [];
    let x = 7;
    for (let i = 0; i < 300; i++) {
      // Sizes from a few bytes to three times the scratch's limit (most far below it); some
      // appends alone, some together.
      x = (x * 48_271) % 2_147_483_647;
      const k = i % 2;
      const text = `${k}-${i}-` + String.fromCharCode(97 + (x % 26)).repeat(i % 4 === 0 ? x % 12_000 : x % 300);
      want[k]!.push(text);
      pending.push(i % 5 === 0 ? Promise.resolve(logs[k]!.appendNow(enc.encode(text))) : logs[k]!.append(enc.encode(text)));
      if (i % 3 !== 1) await Promise.all(pending.splice(0));
    }
    await Promise.all(pending);
    for (const l of logs) await l.close();
    for (const [k, name] of ["a", "b"].entries()) {
      // Back to back in the file, nothing between them, zeros (preallocated) after the last.
      const file = readFileSync(join(root, name, readdirSync(join(root, name)).find((f) => f.endsWith(".log"))!));
      const scan = scanRecords(file, 0, 1);
      expect(scan.lastSeq).toBe(150);
      expect(file.subarray(scan.end).every((b) => b === 0)).toBe(true);
      const again = await ChannelLog.open(name, join(root, name), opts({ sync }));
      expect(again.nextSeq).toBe(151);
      expect((await readAll(again)).map((r) => r.text)).toEqual(want[k]!);
      await again.close();
    }
  });

  test("concurrent appends share fsyncs (group commit)", async () => {
    const dir = join(tmpDir(), "c");
    let fsyncs = 0;
    const log = await ChannelLog.open("c", dir, opts({ onFsync: () => fsyncs++ }), { create: true });
    const n = 512;
    await Promise.all(Array.from({ length: n }, (_, i) => log.append(bodyOf(i))));
    expect(log.nextSeq).toBe(n + 1);
    expect(fsyncs).toBeGreaterThan(0);
    expect(fsyncs).toBeLessThan(n / 8);
    await log.close();
  });

  test("a commit of up to 64 records and 64 KiB is fdatasynced on the event loop when none is in flight; a larger one on the thread pool", async () => {
    const dir = join(tmpDir(), "c");
    let fsyncs = 0;
    // The log's own view of this disk (the same smoothing): only a quick one is fdatasynced inline.
    let smoothedMs = 0;
    const log = await ChannelLog.open(
      "c",
      dir,
      opts({
        // No fill ahead of the writes that one of them could have to wait for.
        preallocateBytes: 0,
        onFsync: (ms) => {
          fsyncs++;
          smoothedMs += (ms - smoothedMs) / 8;
        },
      }),
      { create: true },
    );
    // Warm: the segment's handles are open, and a new file's first slow fdatasync has faded.
    for (let i = 0; i < 32 && (i === 0 || smoothedMs >= 1); i++) await log.append(bodyOf(i));
    const cases = [
      { records: 64, bytes: 300, inline: true },
      { records: 65, bytes: 300, inline: false },
      { records: 64, bytes: 1100, inline: false },
      { records: 1, bytes: 300, inline: true },
    ];
    for (const c of cases) {
      // A turn first: appends that follow a write in the same turn wait for the next one, to share it.
      await new Promise((r) => setImmediate(r));
      const quick = smoothedMs < 2;
      const before = fsyncs;
      const done = log.appendMany(Array.from({ length: c.records }, () => new Uint8Array(c.bytes).fill(7)));
      // The log's write runs in a microtask queued before this continuation; an fdatasync on the
      // thread pool can only finish in a later turn of the event loop.
      await null;
      expect({ ...c, syncedInTheSameTurn: fsyncs - before }).toEqual({ ...c, syncedInTheSameTurn: c.inline && quick ? 1 : 0 });
      expect((await done).length).toBe(c.records);
      expect(fsyncs - before).toBe(1);
    }
    await log.close();
  });

  for (const sync of ["always", "none"] as const) {
    test(`appends from separate callbacks of one turn share commits, as concurrent clients' requests do (sync: ${sync})`, async () => {
      const dir = join(tmpDir(), "c");
      const log = await ChannelLog.open("c", dir, opts({ sync }), { create: true });
      // Warm: the segment's file handle is open, so nothing below waits on the thread pool.
      await log.append(bodyOf(-1));
      let commits = 0;
      log.onCommit(() => commits++);
      // Each append from its own callback, the way a server hands over one request at a time: the
      // microtasks run between them, so only a turn of the event loop lets them meet in a commit.
      const n = 256;
      const done = await Promise.all(Array.from({ length: n }, (_, i) => new Promise<number>((resolve, reject) => setImmediate(() => log.append(bodyOf(i)).then(resolve, reject)))));
      expect(done.sort((a, b) => a - b)).toEqual(Array.from({ length: n }, (_, i) => i + 2));
      expect(commits).toBeGreaterThan(0);
      expect(commits).toBeLessThan(n / 8);
      await log.close();
    });
  }

  test("appendMany: consecutive seqs among single appends, across a segment roll; a bad body stores none of the lot", async () => {
    const dir = join(tmpDir(), "c");
    const log = await ChannelLog.open("c", dir, opts({ segmentBytes: 4096 }), { create: true });
    const single = log.append(bodyOf(0));
    const many = log.appendMany(Array.from({ length: 300 }, (_, i) => bodyOf(1 + i, 20)));
    const after = log.append(bodyOf(301));
    expect(await single).toBe(1);
    expect(await many).toEqual(Array.from({ length: 300 }, (_, i) => i + 2));
    expect(await after).toBe(302);
    expect(log.segmentCount).toBeGreaterThan(1);
    expect(await log.appendMany([])).toEqual([]);
    const err = await log.appendMany([bodyOf(999), new Uint8Array(0)]).catch((e) => e);
    expect(err.code).toBe("too_large");
    const all = await readAll(log);
    expect(all.map((r) => r.seq)).toEqual(Array.from({ length: 302 }, (_, i) => i + 1));
    expect(all[150]!.text).toBe(`record-150${"x".repeat(20)}`);
    await log.close();
  });

  test("enqueue: entries settled by method calls, in one commit with the appends of their turn, in order; a refusal comes before it returns", async () => {
    for (const sync of ["none", "always"] as const) {
      const dir = join(tmpDir(), sync);
      let fsyncs = 0;
      const log = await ChannelLog.open("c", dir, opts({ sync, preallocateBytes: 0, onFsync: () => fsyncs++ }), { create: true });
      await log.append(bodyOf(0));
      const before = fsyncs;
      const settled: string[] = [];
      const entry = (i: number, body = bodyOf(i)) => ({
        body,
        at: performance.now(),
        resolve: (seq: number) => void settled.push(`${i}:${seq}`),
        reject: (err: unknown) => void settled.push(`${i}:${(err as { code: string }).code}`),
      });
      // A window: entries and an append of the same turn share one write (and one fdatasync).
      for (let i = 1; i <= 5; i++) log.enqueue(entry(i));
      const appended = log.append(bodyOf(6));
      log.enqueue(entry(7));
      // Not settled within the call: queued for the turn's commit.
      expect(settled).toEqual([]);
      expect(await appended).toBe(7);
      await waitFor(() => settled.length === 6, "every entry settled");
      expect(settled).toEqual(["1:2", "2:3", "3:4", "4:5", "5:6", "7:8"]);
      if (sync === "always") expect(fsyncs - before).toBe(1);
      // A body the log refuses is refused through `reject`, before the call returns; nothing stored.
      log.enqueue(entry(9, new Uint8Array(0)));
      expect(settled.at(-1)).toBe("9:too_large");
      await log.close();
      log.enqueue(entry(10));
      expect(settled.at(-1)).toBe("10:closed");
      const re = await ChannelLog.open("c", dir, opts({ sync }));
      expect((await readAll(re)).map((r) => r.text)).toEqual(Array.from({ length: 8 }, (_, i) => `record-${i}`));
      await re.close();
    }
  });

  test("sync none and interval acknowledge after write; interval still fsyncs on its timer", async () => {
    for (const sync of ["none", "interval"] as const) {
      const dir = join(tmpDir(), sync);
      let fsyncs = 0;
      const log = await ChannelLog.open("c", dir, opts({ sync, syncIntervalMs: 10, onFsync: () => fsyncs++ }), { create: true });
      await log.append(bodyOf(1));
      expect(fsyncs).toBe(0);
      if (sync === "interval") {
        const deadline = Date.now() + 5000;
        while (fsyncs === 0 && Date.now() < deadline) await Bun.sleep(5);
        expect(fsyncs).toBeGreaterThan(0);
      }
      await log.close();
      const re = await ChannelLog.open("c", dir, opts());
      expect((await readAll(re)).map((r) => r.text)).toEqual(["record-1"]);
      await re.close();
    }
  });

  test("appendNow: a lone record is written before it returns (its seq, not a promise); with fdatasyncs later ones of the same turn share the next write; order kept with append", async () => {
    for (const sync of ["none", "interval", "always"] as const) {
      const dir = join(tmpDir(), sync);
      let fsyncs = 0;
      // No preallocation: a fill running ahead would make a write wait for it (the next test).
      const log = await ChannelLog.open("c", dir, opts({ sync, syncIntervalMs: 60_000, preallocateBytes: 0, onFsync: () => fsyncs++ }), { create: true });
      const turn = () => new Promise((r) => setImmediate(r));
      const first = log.appendNow(bodyOf(0));
      if (sync === "always") {
        // At once only after an fdatasync made right there; else once the one in flight is done.
        if (typeof first === "number") expect(fsyncs).toBe(1);
        expect(await first).toBe(1);
      } else {
        expect(first).toBe(1);
        expect(log.nextSeq).toBe(2);
      }
      await turn();
      const lone = log.appendNow(bodyOf(1));
      if (sync !== "always") expect(lone).toBe(2);
      // In the same turn: with fdatasyncs, queued behind the write just made, to share the next
      // one, as `append` would be; without, written at once too.
      const same = log.appendNow(bodyOf(2));
      if (sync === "always") expect(same).toBeInstanceOf(Promise);
      else expect(same).toBe(3);
      // Behind an append still queued: queued too, whatever the sync mode.
      const queued = log.append(bodyOf(3));
      const after = log.appendNow(bodyOf(4));
      expect(after).toBeInstanceOf(Promise);
      expect(await Promise.all([lone, same, queued, after])).toEqual([2, 3, 4, 5]);
      await turn();
      if (sync !== "always") expect(log.appendNow(bodyOf(5))).toBe(6);
      else expect(await log.appendNow(bodyOf(5))).toBe(6);
      await log.close();
      await expect(Promise.resolve(log.appendNow(bodyOf(6)))).rejects.toMatchObject({ code: "closed" });
      const re = await ChannelLog.open("c", dir, opts({ sync }));
      expect((await readAll(re)).map((r) => r.text)).toEqual(Array.from({ length: 6 }, (_, i) => `record-${i}`));
      await re.close();
    }
  });

  test("segments roll at segmentBytes, are named by first seq, and sealed ones are never rewritten", async () => {
    const dir = join(tmpDir(), "c");
    const log = await ChannelLog.open("c", dir, opts({ segmentBytes: 4096 }), { create: true });
    for (let i = 0; i < 100; i++) await log.append(bodyOf(i, 100));
    const files = readdirSync(dir).sort();
    expect(files.length).toBeGreaterThan(3);
    expect(files[0]).toBe("00000000000000000001.log");
    for (const f of files) expect(statSync(join(dir, f)).size).toBeLessThanOrEqual(4096);
    const sealed = files.slice(0, -1).map((f) => readFileSync(join(dir, f)));
    for (let i = 100; i < 150; i++) await log.append(bodyOf(i, 100));
    files.slice(0, -1).forEach((f, i) => {
      expect(readFileSync(join(dir, f)).equals(sealed[i]!)).toBe(true);
    });
    // Each file name is the seq of its first record.
    const re = await ChannelLog.open("c", dir, opts({ segmentBytes: 4096 }));
    const all = await readAll(re);
    expect(all.length).toBe(150);
    expect(all.every((r, i) => r.seq === i + 1 && r.text.startsWith(`record-${i}x`))).toBe(true);
    await re.close();
    await log.close();
  });

  test("a read from any seq lands on that seq (sparse index), across segments", async () => {
    const dir = join(tmpDir(), "c");
    const log = await ChannelLog.open("c", dir, opts({ segmentBytes: 64 * 1024, tailCacheBytes: 0 }), { create: true });
    await Promise.all(Array.from({ length: 3000 }, (_, i) => log.append(bodyOf(i, 40))));
    await log.close();
    const re = await ChannelLog.open("c", dir, opts({ segmentBytes: 64 * 1024, tailCacheBytes: 0 }));
    for (const from of [1, 2, 77, 1000, 1499, 1500, 2999, 3000]) {
      const got = await re.read(from, 3);
      expect(got.map((r) => r.seq)).toEqual([from, from + 1, from + 2].filter((s) => s <= 3000));
      expect(dec.decode(got[0]!.body)).toStartWith(`record-${from - 1}x`);
    }
    expect(await re.read(3001)).toEqual([]);
    await re.close();
  });

  test("tail cache and disk give the same records; the cache is kept only while someone reads", async () => {
    const dir = join(tmpDir(), "c");
    const log = await ChannelLog.open("c", dir, opts({ tailCacheBytes: 500 }), { create: true });
    try {
      // Nobody reads: nothing is cached.
      for (let i = 0; i < 50; i++) await log.append(bodyOf(i));
      expect(log.appendedAt(50)).toBeUndefined();
      // A commit listener (a subscription waiting for records) turns the cache on.
      const off = log.onCommit(() => {});
      for (let i = 50; i < 100; i++) await log.append(bodyOf(i));
      expect(log.appendedAt(100)).toBeNumber();
      expect(log.appendedAt(50)).toBeUndefined(); // appended while nobody read
      off();
      // So does a recent read, without a listener.
      expect((await log.read(1, 1)).length).toBe(1);
      for (let i = 100; i < 200; i++) await log.append(bodyOf(i));
      expect(log.appendedAt(200)).toBeNumber();
      const fromCache = await log.read(190, 100);
      const fromDisk = await log.read(1, 200);
      expect(fromDisk.map((r) => r.seq)).toEqual(Array.from({ length: 200 }, (_, i) => i + 1));
      expect(fromCache.map((r) => dec.decode(r.body))).toEqual(fromDisk.slice(189).map((r) => dec.decode(r.body)));
      expect(log.appendedAt(1)).toBeUndefined();
    } finally {
      await log.close();
    }
  });

  test("commit listeners fire after records become readable", async () => {
    const log = await ChannelLog.open("c", join(tmpDir(), "c"), opts(), { create: true });
    const seen: [number, number][] = [];
    log.onCommit((a, b) => {
      seen.push([a, b]);
    });
    await log.append(bodyOf(1));
    expect(seen).toEqual([[1, 2]]);
    expect((await log.read(1)).length).toBe(1);
    await log.close();
  });

  test("commit listeners: one registered twice is called once, a remover stops only its own, one may leave while called", async () => {
    for (const sync of ["always", "none"] as const) {
      const log = await ChannelLog.open("c", join(tmpDir(), "c"), opts({ sync }), { create: true });
      const calls: string[] = [];
      const a = () => void calls.push("a");
      const offA = log.onCommit(a);
      log.onCommit(a);
      const offB = log.onCommit(() => {
        calls.push("b");
        offB();
      });
      log.onCommit(() => void calls.push("c"));
      await log.append(bodyOf(1));
      expect(calls).toEqual(["a", "b", "c"]);
      calls.length = 0;
      expect(log.appendNow(bodyOf(2))).toBeDefined();
      await log.append(bodyOf(3));
      // b left during the first commit; a and c stay for every later one.
      expect(calls.filter((c) => c === "b")).toEqual([]);
      expect(calls.filter((c) => c === "a").length).toBeGreaterThanOrEqual(1);
      expect(calls.filter((c) => c === "a").length).toBe(calls.filter((c) => c === "c").length);
      offA();
      calls.length = 0;
      await log.append(bodyOf(4));
      expect(calls).toEqual(["c"]);
      await log.close();
    }
  });

  test("torn tail: cut at every byte of the last records, reopen keeps whole records and appends work", async () => {
    const base = tmpDir();
    const src = join(base, "src");
    const log = await ChannelLog.open("c", src, opts(), { create: true });
    for (let i = 0; i < 30; i++) await log.append(bodyOf(i, i));
    await log.close();
    const seg = join(src, "00000000000000000001.log");
    const full = readFileSync(seg);
    const ends: number[] = [];
    let off = 0;
    for (let i = 0; i < 30; i++) ends.push((off += RECORD_HEADER_BYTES + bodyOf(i, i).length));
    const positions = new Set<number>();
    for (let p = ends[26]!; p <= full.length; p++) positions.add(p);
    for (let k = 0; k < 40; k++) positions.add(Math.floor(Math.random() * full.length));
    let reported = 0;
    for (const cut of positions) {
      const dir = join(base, `cut-${cut}`);
      mkdirSync(dir);
      writeFileSync(join(dir, "00000000000000000001.log"), full.subarray(0, cut));
      const { logger, lines } = capture();
      const re = await ChannelLog.open("c", dir, opts({ logger }));
      const whole = ends.filter((e) => e <= cut).length;
      expect(re.nextSeq).toBe(whole + 1);
      const all = await readAll(re);
      expect(all.map((r) => r.text)).toEqual(Array.from({ length: whole }, (_, i) => `record-${i}` + "x".repeat(i)));
      const cutBytes = cut - (ends[whole - 1] ?? 0);
      if (cutBytes > 0) {
        reported++;
        expect(lines.some((l) => l.includes("recovered torn tail") && l.includes(`"cut_bytes":${cutBytes}`))).toBe(true);
      }
      expect(await re.append(enc.encode("after"))).toBe(whole + 1);
      await re.close();
      const again = await ChannelLog.open("c", dir, opts());
      expect((await readAll(again)).map((r) => r.text).at(-1)).toBe("after");
      await again.close();
    }
    expect(reported).toBeGreaterThan(20);
  });

  test("a bad record in the active segment with good ones after it is kept as damage; a bad last record is a torn tail; zeros are preallocated space", async () => {
    const base = tmpDir();
    const dir = join(base, "c");
    const log = await ChannelLog.open("c", dir, opts(), { create: true });
    for (let i = 0; i < 10; i++) await log.append(bodyOf(i));
    await log.close();
    const seg = join(dir, "00000000000000000001.log");
    const rec = RECORD_HEADER_BYTES + bodyOf(0).length;
    appendFileSync(seg, new Uint8Array(4096));
    // Zeros after the last record are preallocated space (or what a file system left): kept, not reported.
    const { logger, lines } = capture();
    let re = await ChannelLog.open("c", dir, opts({ logger }));
    expect(re.nextSeq).toBe(11);
    expect(lines.filter((l) => l.includes("torn tail"))).toEqual([]);
    expect(await re.append(bodyOf(10))).toBe(11);
    const at = 10 * rec + RECORD_HEADER_BYTES;
    expect(
      readFileSync(seg)
        .subarray(at, at + 9)
        .toString(),
    ).toBe("record-10");
    await re.close();
    const check = await ChannelLog.open("c", dir, opts());
    expect((await readAll(check)).map((r) => r.text).at(-1)).toBe("record-10");
    await check.close();
    truncateSync(seg, 10 * rec);
    const before = statSync(seg).size;
    expect(before).toBe(10 * (RECORD_HEADER_BYTES + bodyOf(0).length));
    const bytes = readFileSync(seg);
    bytes[rec * 6 + 20]! ^= 0xff; // inside record 7's body
    writeFileSync(seg, bytes);
    const damaged = capture();
    re = await ChannelLog.open("c", dir, opts({ logger: damaged.logger }));
    // Records 8-10 after the damage are kept and readable; 7 is reported lost, with its range.
    expect(re.nextSeq).toBe(11);
    expect((await readAll(re)).map((r) => r.seq)).toEqual([1, 2, 3, 4, 5, 6, 8, 9, 10]);
    expect(statSync(seg).size).toBe(before);
    const health = re.health();
    expect(health.damagedRecords).toBe(1);
    expect(health.damage).toMatchObject([{ offset: 6 * rec, bytes: rec, firstSeq: 7, lastSeq: 7, reason: "bad_crc" }]);
    const line = JSON.parse(damaged.lines.find((l) => l.includes("corruption in the middle"))!);
    expect(line).toMatchObject({ level: "error", first_lost_seq: 7, last_lost_seq: 7 });
    expect(damaged.lines.some((l) => l.includes("torn tail"))).toBe(false);
    // Appends go on after the kept records, and all of it survives another reopen.
    expect(await re.append(bodyOf(10))).toBe(11);
    await re.close();
    re = await ChannelLog.open("c", dir, opts());
    expect((await readAll(re)).map((r) => r.seq)).toEqual([1, 2, 3, 4, 5, 6, 8, 9, 10, 11]);
    await re.close();
    // The last record bad, nothing valid after it: a torn tail, cut.
    const tornBytes = readFileSync(seg);
    tornBytes[tornBytes.length - 3]! ^= 0xff;
    writeFileSync(seg, tornBytes);
    const torn = capture();
    re = await ChannelLog.open("c", dir, opts({ logger: torn.logger }));
    expect(re.nextSeq).toBe(11);
    expect(torn.lines.some((l) => l.includes("torn tail"))).toBe(true);
    expect(statSync(seg).size).toBe(before);
    await re.close();
  });

  test("an active segment larger than one scan chunk reopens whole, with no damage at the chunk edges", async () => {
    const dir = join(tmpDir(), "c");
    const log = await ChannelLog.open("c", dir, opts({ sync: "none" }), { create: true });
    // 2,200 records of about 2 KiB: past the 4 MiB the scan reads at a time, records crossing its edge.
    await Promise.all(Array.from({ length: 2200 }, (_, i) => log.append(bodyOf(i, 2000))));
    await log.close();
    const { logger, lines } = capture();
    const re = await ChannelLog.open("c", dir, opts({ logger }));
    expect(re.nextSeq).toBe(2201);
    expect(re.health().damage).toEqual([]);
    expect(lines.filter((l) => l.includes("corruption") || l.includes("torn tail"))).toEqual([]);
    await re.close();
  });

  test("a seq gap with good records after it is damage of zero bytes; the records after it are read", async () => {
    const dir = join(tmpDir(), "c");
    const log = await ChannelLog.open("c", dir, opts(), { create: true });
    for (let i = 0; i < 5; i++) await log.append(bodyOf(i));
    await log.close();
    // Records 1-2, then 4-5 with 3 gone without a trace (as a write-back failure can leave it).
    const seg = join(dir, "00000000000000000001.log");
    const rec = RECORD_HEADER_BYTES + bodyOf(0).length;
    const b = readFileSync(seg);
    writeFileSync(seg, Buffer.concat([b.subarray(0, 2 * rec), b.subarray(3 * rec)]));
    const re = await ChannelLog.open("c", dir, opts());
    expect(re.nextSeq).toBe(6);
    expect((await readAll(re)).map((r) => r.seq)).toEqual([1, 2, 4, 5]);
    expect(re.health().damage).toMatchObject([{ offset: 2 * rec, bytes: 0, firstSeq: 3, lastSeq: 3, reason: "bad_seq" }]);
    await re.close();
  });

  test("one read fills its batch across small segments, in order, up to its limits", async () => {
    const dir = join(tmpDir(), "c");
    const log = await ChannelLog.open("c", dir, opts({ segmentBytes: 4096, tailCacheBytes: 0 }), { create: true });
    try {
      for (let i = 0; i < 300; i++) await log.append(bodyOf(i, 50));
      expect(readdirSync(dir).length).toBeGreaterThan(5);
      const all = await log.read(1, 1000);
      expect(all.map((r) => r.seq)).toEqual(Array.from({ length: 300 }, (_, i) => i + 1));
      expect(dec.decode(all[299]!.body)).toBe("record-299" + "x".repeat(50));
      const some = await log.read(10, 120);
      expect(some.map((r) => r.seq)).toEqual(Array.from({ length: 120 }, (_, i) => i + 10));
      const few = await log.read(1, 1000, 1000); // about 1,000 bytes: a record of ~70 past it at most
      expect(few.length).toBeGreaterThan(5);
      expect(few.length).toBeLessThan(20);
    } finally {
      await log.close();
    }
  });

  test("a lot of segments open without scanning the sealed ones", async () => {
    const dir = join(tmpDir(), "c");
    const log = await ChannelLog.open("c", dir, opts({ segmentBytes: 4096, sync: "none" }), { create: true });
    await Promise.all(Array.from({ length: 2000 }, (_, i) => log.append(bodyOf(i, 50))));
    await log.close();
    const segs = readdirSync(dir).length;
    expect(segs).toBeGreaterThan(20);
    // Corrupt a sealed segment's middle: open must not notice (lazy); a read there steps over the damage.
    const second = readdirSync(dir).sort()[1]!;
    const p = join(dir, second);
    const b = readFileSync(p);
    b[200]! ^= 0xff;
    writeFileSync(p, b);
    const re = await ChannelLog.open("c", dir, opts({ segmentBytes: 4096, tailCacheBytes: 0 }));
    expect(re.nextSeq).toBe(2001);
    const firstOfSecond = Number(second.slice(0, 20));
    expect(re.health().damagedRecords).toBe(0);
    const got = await re.read(firstOfSecond, 1000);
    const damage = re.health().damage;
    expect(damage.length).toBe(1);
    const lost = damage[0]!.firstSeq;
    expect(damage[0]!.lastSeq).toBe(lost);
    expect(lost).toBeGreaterThan(firstOfSecond);
    expect(got.map((r) => r.seq)).toEqual(
      Array.from({ length: got.length + 1 }, (_, i) => firstOfSecond + i)
        .filter((q) => q !== lost)
        .slice(0, got.length),
    );
    expect(got.at(-1)!.seq).toBeGreaterThan(lost);
    await re.close();
  });

  test("retention by bytes removes the oldest sealed segments, never the active one", async () => {
    const dir = join(tmpDir(), "c");
    const log = await ChannelLog.open("c", dir, opts({ segmentBytes: 4096 }), { create: true });
    for (let i = 0; i < 300; i++) await log.append(bodyOf(i, 100));
    const segs = log.segmentCount;
    const r = await log.applyRetention({ maxBytes: 3 * 4096, pinnedSeq: 1 });
    expect(r.removedSegments).toBe(segs - 3);
    expect(log.bytes).toBeLessThanOrEqual(3 * 4096);
    expect(log.firstSeq).toBe(r.firstSeq);
    expect(r.removedRecords).toBe(r.firstSeq - 1);
    const all = await readAll(log, 1);
    expect(all[0]!.seq).toBe(r.firstSeq);
    expect(all.at(-1)!.seq).toBe(300);
    const tiny = await log.applyRetention({ maxBytes: 1, pinnedSeq: 1 });
    expect(log.segmentCount).toBe(1);
    expect(tiny.firstSeq).toBeLessThanOrEqual(300);
    await log.close();
  });

  test("retention by age keeps segments a cursor still needs", async () => {
    const dir = join(tmpDir(), "c");
    const log = await ChannelLog.open("c", dir, opts({ segmentBytes: 4096 }), { create: true });
    for (let i = 0; i < 200; i++) await log.append(bodyOf(i, 100));
    await Bun.sleep(5); // ages must exceed 1 ms
    const pinned = await log.applyRetention({ maxAgeMs: 1, pinnedSeq: 1 });
    expect(pinned.removedSegments).toBe(0);
    const partly = await log.applyRetention({ maxAgeMs: 1, pinnedSeq: 60 });
    expect(partly.removedSegments).toBeGreaterThan(0);
    expect(log.firstSeq).toBeLessThanOrEqual(60);
    const all = await log.applyRetention({ maxAgeMs: 1, pinnedSeq: 201 });
    expect(log.segmentCount).toBe(1);
    expect(all.firstSeq).toBe(log.firstSeq);
    await log.close();
  });

  test("records written while the space ahead is being zeroed never lose bytes to the zeros (small fill steps, one record a tick)", async () => {
    const dir = join(tmpDir(), "c");
    // A fill of 4 KiB runs on the thread pool every few records; each append below is written in place at
    // once, so most land while a fill is running, and those past its start must wait for it.
    const log = await ChannelLog.open("c", dir, opts({ sync: "none", preallocateBytes: 4096 }), { create: true });
    const n = 1500;
    for (let i = 0; i < n; i++) await log.append(bodyOf(i, 200));
    await log.close();
    const again = await ChannelLog.open("c", dir, opts({ sync: "none" }));
    expect(again.health().damagedRecords).toBe(0);
    expect(again.nextSeq).toBe(n + 1);
    const all = await readAll(again);
    expect(all.map((r) => r.text)).toEqual(Array.from({ length: n }, (_, i) => `record-${i}${"x".repeat(200)}`));
    await again.close();
  });

  test("appendNow while the space ahead is being zeroed: records that must wait for the fill come as promises, and none loses bytes to the zeros", async () => {
    const dir = join(tmpDir(), "c");
    const log = await ChannelLog.open("c", dir, opts({ sync: "none", preallocateBytes: 4096 }), { create: true });
    const n = 1500;
    let now = 0;
    let waited = 0;
    try {
      // Groups of 20 records (4.4 KB, more than one 4 KiB fill step) written without a turn
      // between them: the fill that one starts cannot finish within the group, so the records
      // past the zeroed end wait for it; between groups it finishes.
      for (let g = 0; g < n; g += 20) {
        const results: (number | Promise<number>)[] = [];
        for (let i = g; i < g + 20; i++) results.push(log.appendNow(bodyOf(i, 200)));
        for (const r of results) {
          if (typeof r === "number") now++;
          else waited++;
        }
        expect(await Promise.all(results)).toEqual(Array.from({ length: 20 }, (_, k) => g + k + 1));
        await new Promise((res) => setImmediate(res));
      }
      expect(now).toBeGreaterThan(0);
      expect(waited).toBeGreaterThan(0);
      expect(now + waited).toBe(n);
    } finally {
      await log.close();
    }
    const again = await ChannelLog.open("c", dir, opts({ sync: "none" }));
    expect(again.health().damagedRecords).toBe(0);
    expect((await readAll(again)).map((r) => r.text)).toEqual(Array.from({ length: n }, (_, i) => `record-${i}${"x".repeat(200)}`));
    await again.close();
  });

  for (const sync of ["always", "none"] as const) {
    test(`close writes the appends made just before it, and their promises resolve (sync: ${sync})`, async () => {
      const dir = join(tmpDir(), "c");
      const log = await ChannelLog.open("c", dir, opts({ sync }), { create: true });
      await log.append(bodyOf(0));
      // One append waits for the turn after a write, the others for the end of this tick.
      const first = log.append(bodyOf(1));
      await Promise.resolve();
      const rest = [log.append(bodyOf(2)), log.append(bodyOf(3))];
      await log.close();
      expect(await Promise.all([first, ...rest])).toEqual([2, 3, 4]);
      const again = await ChannelLog.open("c", dir, opts({ sync }));
      expect((await readAll(again)).map((r) => r.text)).toEqual(["record-0", "record-1", "record-2", "record-3"]);
      await again.close();
    });
  }

  test("a closed log refuses appends with a typed error", async () => {
    const log = await ChannelLog.open("c", join(tmpDir(), "c"), opts(), { create: true });
    await log.close();
    await expect(log.append(bodyOf(1))).rejects.toMatchObject({ code: "closed" });
  });
});
