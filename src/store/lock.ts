/**
 * One process per data directory (docs/storage.md, "The lock").
 *
 * An advisory `flock(LOCK_EX | LOCK_NB)` on `<data_dir>/LOCK`, taken through
 * bun:ffi: the kernel drops it when the process dies, even by SIGKILL, so a
 * crash never leaves a stale lock behind. The holder's pid is written into
 * the file for the error message of the process that is refused. Where libc
 * cannot be loaded, a pid file checked with kill(pid, 0) stands in.
 */
import { dlopen, FFIType } from "bun:ffi";
import { closeSync, ftruncateSync, openSync, readFileSync, unlinkSync, writeSync } from "node:fs";
import { join } from "node:path";
import { LockedError } from "../errors.ts";

const LOCK_EX = 2;
const LOCK_NB = 4;
const LIBC_NAMES = ["libc.so.6", `libc.musl-${process.arch === "arm64" ? "aarch64" : "x86_64"}.so.1`, "libc.so"];

type FlockFn = (fd: number, op: number) => number;
let flockFn: FlockFn | null | undefined;

function loadFlock(): FlockFn | null {
  if (flockFn !== undefined) return flockFn;
  flockFn = null;
  for (const name of LIBC_NAMES) {
    try {
      const lib = dlopen(name, { flock: { args: [FFIType.i32, FFIType.i32], returns: FFIType.i32 } });
      flockFn = (fd, op) => lib.symbols.flock(fd, op) as number;
      break;
    } catch {
      // try the next name
    }
  }
  return flockFn;
}

/** A held lock; `release` closes it (the kernel also does on exit). */
export interface DirLock {
  readonly path: string;
  release(): void;
}

/** Takes the data directory lock or throws `LockedError` naming the holder. */
export function lockDataDir(dataDir: string): DirLock {
  const path = join(dataDir, "LOCK");
  const flock = loadFlock();
  const fd = openSync(path, "a+");
  if (flock) {
    if (flock(fd, LOCK_EX | LOCK_NB) !== 0) {
      closeSync(fd);
      throw new LockedError(`data directory ${dataDir} is in use by another keyop process${holder(path)}`);
    }
  } else {
    const pid = Number(readFileSync(path, "utf8").trim());
    if (pid > 0 && pid !== process.pid && alive(pid)) {
      closeSync(fd);
      throw new LockedError(`data directory ${dataDir} is in use by another keyop process (pid ${pid})`);
    }
  }
  try {
    // Only for the error message of a refused process: a full disk must not stop the start.
    ftruncateSync(fd, 0);
    writeSync(fd, `${process.pid}\n`, 0);
  } catch {
    // keep going without the pid
  }
  let released = false;
  return {
    path,
    release() {
      if (released) return;
      released = true;
      if (!flock) {
        try {
          unlinkSync(path);
        } catch {
          // already gone
        }
      }
      closeSync(fd);
    },
  };
}

function holder(path: string): string {
  try {
    const pid = Number(readFileSync(path, "utf8").trim());
    return pid > 0 ? ` (pid ${pid})` : "";
  } catch {
    return "";
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as { code?: string }).code === "EPERM";
  }
}
