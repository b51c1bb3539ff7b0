/**
 * A file system on a disk that can be made to fail and come back: ext4
 * without a journal, mounted errors=continue, on a loop device whose backing
 * file lives on a tmpfs of a chosen size. Filling the tmpfs makes write-back
 * of every block not yet backed fail with EIO; growing it makes the disk
 * work again. Needs root (mount, losetup).
 *
 * The loop driver completes a short write to its backing file as a success
 * (lo_complete_rq retries only short reads), so a request that fills the
 * tmpfs halfway would leave a hole the file system was told is written: a
 * disk that lies, which no application can survive. Requests are therefore
 * capped at one page, which tmpfs either stores whole or refuses.
 */
import { mkdirSync, writeFileSync, rmSync } from "node:fs";
import { join } from "node:path";

export interface FlakyDisk {
  mountPoint: string;
  /** Fills the tmpfs behind the loop device: write-back of new blocks fails from now on. */
  fillBacking(): void;
  /** Removes the filler and grows the tmpfs to `mib`: the disk works again. */
  growBacking(mib: number): void;
  /** Unmounts and mounts again, so nothing is read from the page cache. */
  remount(): void;
  destroy(): void;
}

function run(cmd: string[]): { ok: boolean; out: string } {
  const r = Bun.spawnSync(cmd, { stdout: "pipe", stderr: "pipe" });
  return { ok: r.exitCode === 0, out: (r.stdout.toString() + r.stderr.toString()).trim() };
}

/** Makes the disk under `root` with a `tmpfsMib` tmpfs behind it, or says why it cannot. */
export function makeFlakyDisk(root: string, tmpfsMib: number): FlakyDisk | string {
  const backing = join(root, "backing");
  const mountPoint = join(root, "mnt");
  mkdirSync(backing);
  mkdirSync(mountPoint);
  const steps: (() => void)[] = [];
  const undo = () => {
    for (const s of steps.reverse()) s();
  };
  let r = run(["mount", "-t", "tmpfs", "-o", `size=${tmpfsMib}m`, "tmpfs", backing]);
  if (!r.ok) return `mount tmpfs: ${r.out}`;
  steps.push(() => run(["umount", backing]));
  const img = join(backing, "disk.img");
  r = run(["truncate", "-s", "600M", img]);
  if (r.ok) r = run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", img]);
  if (!r.ok) return (undo(), `mkfs.ext4: ${r.out}`);
  r = run(["losetup", "-f", "--show", img]);
  if (!r.ok) return (undo(), `losetup: ${r.out}`);
  const loop = r.out;
  steps.push(() => run(["losetup", "-d", loop]));
  try {
    writeFileSync(`/sys/block/${loop.replace("/dev/", "")}/queue/max_sectors_kb`, "4");
  } catch (err) {
    return (undo(), `cap the loop device's requests at one page: ${String(err)}`);
  }
  const mount = () => run(["mount", "-o", "errors=continue", loop, mountPoint]);
  r = mount();
  if (!r.ok) return (undo(), `mount ${loop}: ${r.out}`);
  let mounted = true;
  steps.push(() => mounted && run(["umount", mountPoint]));
  const filler = join(backing, "filler");
  return {
    mountPoint,
    fillBacking() {
      try {
        writeFileSync(filler, new Uint8Array(tmpfsMib * 1024 * 1024));
      } catch {
        // ENOSPC is the point: the tmpfs is now full.
      }
    },
    growBacking(mib) {
      rmSync(filler, { force: true });
      const g = run(["mount", "-o", `remount,size=${mib}m`, backing]);
      if (!g.ok) throw new Error(`grow tmpfs: ${g.out}`);
    },
    remount() {
      const u = run(["umount", mountPoint]);
      if (!u.ok) throw new Error(`umount: ${u.out}`);
      mounted = false;
      const m = mount();
      if (!m.ok) throw new Error(`mount again: ${m.out}`);
      mounted = true;
    },
    destroy: undo,
  };
}
