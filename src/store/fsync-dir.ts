/**
 * fsync of a directory, so that a created, renamed or removed entry survives
 * a power cut (POSIX makes the file's data durable, not its name).
 */
import { open, rename, unlink } from "node:fs/promises";

/** Flushes the directory entry table of `dir` to disk, off the event loop. */
export async function fsyncDir(dir: string): Promise<void> {
  const fh = await open(dir, "r");
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** Removes `path`; a file that is already gone is not an error, anything else is. */
export async function unlinkIfExists(path: string): Promise<void> {
  try {
    await unlink(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
}

/**
 * Writes `data` to `path` atomically: a temp file, fdatasync, rename, and
 * an fsync of `dir` (null: the caller syncs the directory once for several
 * files). A failure leaves the old file as it was (the temp file is removed
 * where the disk allows) and throws.
 */
export async function writeFileAtomic(path: string, data: string | Uint8Array, dir: string | null): Promise<void> {
  const tmp = `${path}.tmp`;
  try {
    const fh = await open(tmp, "w");
    try {
      await fh.writeFile(data);
      await fh.datasync();
    } finally {
      await fh.close();
    }
    await rename(tmp, path);
  } catch (err) {
    // Best effort: a temp file left behind is removed at the next open.
    await unlink(tmp).catch(() => undefined);
    throw err;
  }
  if (dir !== null) await fsyncDir(dir);
}
