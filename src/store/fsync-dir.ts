/**
 * fsync of a directory, so that a created, renamed or removed entry survives
 * a power cut (POSIX makes the file's data durable, not its name).
 */
import { open } from "node:fs/promises";

/** Flushes the directory entry table of `dir` to disk, off the event loop. */
export async function fsyncDir(dir: string): Promise<void> {
  const fh = await open(dir, "r");
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}
