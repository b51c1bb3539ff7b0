import { expect, test } from "bun:test";
import { fileCallsIn } from "../../bench/steady.ts";
import { costBetween, snapshotOf, withEnded } from "../../bench/servers.ts";

test("a call on a descriptor counts as a call on the file it was opened from", () => {
  const text = [
    `[pid 25904] openat(AT_FDCWD, "/proc/self/statm", O_RDONLY|O_CLOEXEC) = 13`,
    `[pid 25904] newfstatat(13, "", {st_mode=S_IFREG|0444, st_size=0, ...}, AT_EMPTY_PATH) = 0`,
    `[pid 25904] openat(AT_FDCWD, "/data/cursor", O_WRONLY|O_CREAT, 0644) = 14`,
    `[pid 25904] newfstatat(14, "", {st_mode=S_IFREG|0644, st_size=8, ...}, AT_EMPTY_PATH) = 0`,
    `[pid 25904] fdatasync(14) = 0`,
  ].join("\n");
  const r = fileCallsIn(text);
  expect(r.proc).toBe(2);
  expect(r.count).toBe(3);
  expect(r.names).toBe("openat /data/cursor x1, newfstatat /data/cursor x1, fdatasync x1");
});

test("wake-ups of a thread that ended inside a window are kept from the last reading", async () => {
  // A worker is a thread of this process: it sleeps and wakes a few times, then ends.
  const s0 = snapshotOf([process.pid]);
  const worker = new Worker(URL.createObjectURL(new Blob([`for (let i = 0; i < 5; i++) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20); postMessage("done");`])));
  let seen = s0;
  const done = new Promise<void>((resolve) => {
    worker.onmessage = () => resolve();
  });
  // Read while it runs, as the idle step reads every second.
  const reading = setInterval(() => {
    seen = withEnded(seen, snapshotOf([process.pid]));
  }, 5);
  await done;
  seen = withEnded(seen, snapshotOf([process.pid]));
  clearInterval(reading);
  const threadsWhileRunning = snapshotOf([process.pid]).threads.size;
  worker.terminate();
  const deadline = Date.now() + 10_000;
  while (snapshotOf([process.pid]).threads.size >= threadsWhileRunning && Date.now() < deadline) await Bun.sleep(20);
  const after = snapshotOf([process.pid]);
  expect(after.threads.size).toBeLessThan(threadsWhileRunning);
  const kept = withEnded(seen, after);
  // Every thread read while the worker ran is still there, the ended ones at their last reading.
  for (const id of seen.threads.keys()) expect(kept.threads.has(id)).toBe(true);
  expect(costBetween(s0, kept).wakeups).toBeGreaterThan(costBetween(s0, after).wakeups);
});
