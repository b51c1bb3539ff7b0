/**
 * The API socket file: a file left by a killed agent makes the next listen
 * fail, so before listening we probe it. Nothing answers: stale, removed.
 * Something answers: another agent is running, and we refuse to start.
 */
import { lstat, mkdir, unlink } from "node:fs/promises";
import { dirname } from "node:path";
import { InUseError } from "../errors.ts";

/** Connects to `path`; true when something accepts within `timeoutMs`. */
export async function socketAnswers(path: string, timeoutMs = 1000): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    let settled = false;
    const done = (v: boolean) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(v);
    };
    const timer = setTimeout(() => done(false), timeoutMs);
    Bun.connect({
      unix: path,
      socket: {
        open(s) {
          s.end();
          done(true);
        },
        data() {},
        error() {
          done(false);
        },
        connectError() {
          done(false);
        },
      },
    }).catch(() => done(false));
  });
}

/**
 * Makes `path` free for listening: creates its directory, removes a stale
 * socket file, throws `InUseError` when a live process answers on it or
 * the path is something other than a socket.
 */
export async function prepareSocketPath(path: string): Promise<"fresh" | "stale-removed"> {
  await mkdir(dirname(path), { recursive: true });
  let st: Awaited<ReturnType<typeof lstat>>;
  try {
    st = await lstat(path);
  } catch (err) {
    if ((err as { code?: string }).code === "ENOENT") return "fresh";
    throw err;
  }
  if (!st.isSocket()) throw new InUseError(`${path} exists and is not a socket; refusing to replace it`);
  if (await socketAnswers(path)) throw new InUseError(`another process is serving ${path} (is keyop already running?)`);
  await unlink(path);
  return "stale-removed";
}
