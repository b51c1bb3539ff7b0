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
  // A process of its own, so that nothing else this test run starts or ends shares its thread list:
  // a thread that sleeps and wakes 50 times, then ends, while the process stays.
  const child = Bun.spawn(
    [
      "python3",
      "-c",
      "import threading, time, sys\nt = threading.Thread(target=lambda: [time.sleep(0.02) for _ in range(50)])\nt.start(); print('started', flush=True); t.join(); print('ended', flush=True); time.sleep(60)",
    ],
    { stdout: "pipe" },
  );
  try {
    const lines = child.stdout.getReader();
    let out = "";
    const waitFor = async (word: string) => {
      while (!out.includes(word)) {
        const { value, done } = await lines.read();
        if (done) throw new Error(`the child ended before printing ${word}`);
        out += new TextDecoder().decode(value);
      }
    };
    await waitFor("started");
    const s0 = snapshotOf([child.pid]);
    let seen = s0;
    // Read while the thread runs, as the idle step reads every second.
    const reading = setInterval(() => {
      seen = withEnded(seen, snapshotOf([child.pid]));
    }, 50);
    await waitFor("ended");
    clearInterval(reading);
    // join() can return a moment before the kernel has removed the thread.
    let after = snapshotOf([child.pid]);
    for (const deadline = Date.now() + 5000; after.threads.size === seen.threads.size && Date.now() < deadline; after = snapshotOf([child.pid])) await Bun.sleep(10);
    const ended = [...seen.threads.keys()].filter((id) => !after.threads.has(id));
    expect(ended.length).toBe(1);
    const kept = withEnded(seen, after);
    expect(kept.threads.has(ended[0]!)).toBe(true);
    // Its wake-ups up to the last reading count; read at the two ends only, they are lost.
    expect(costBetween(s0, kept).wakeups - costBetween(s0, after).wakeups).toBeGreaterThan(10);
  } finally {
    child.kill();
    await child.exited;
  }
});
