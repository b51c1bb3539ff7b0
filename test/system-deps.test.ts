/**
 * The test command's own check of the system packages (test/system-deps.sh),
 * run with a PATH that has none of them: it installs them with apt-get when
 * it can, and otherwise stops with one line saying what to install.
 */
import { describe, expect, test } from "bun:test";
import { chmodSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { tmpDir } from "./helpers.ts";

const script = join(import.meta.dir, "system-deps.sh");

/** A bin directory with only what the script itself runs, and optionally a fake apt-get. */
function bareBin(aptGet: "ok" | "fails" | null): { bin: string; log: string } {
  const d = tmpDir("keyop-deps-");
  const bin = join(d, "bin");
  mkdirSync(bin);
  for (const tool of ["uname", "awk", "tr", "id"]) symlinkSync(Bun.which(tool)!, join(bin, tool));
  const log = join(d, "apt.log");
  if (aptGet) {
    writeFileSync(join(bin, "apt-get"), `#!${Bun.which("bash")}\necho "$@" >> ${log}\n${aptGet === "ok" ? "exit 0" : "exit 100"}\n`);
    chmodSync(join(bin, "apt-get"), 0o755);
  }
  return { bin, log };
}

const run = (bin: string, env: Record<string, string> = {}) => {
  const r = Bun.spawnSync([Bun.which("bash")!, script], { env: { PATH: bin, ...env }, stdout: "pipe", stderr: "pipe" });
  return { code: r.exitCode, err: r.stderr.toString().trim() };
};

const all = "curl gcc libc6-dev python3 openssl mosquitto-clients nats-server pkg-config fuse3 libfuse3-dev libssl-dev chromium e2fsprogs mount";

describe.skipIf(process.platform !== "linux")("npm test's system packages", () => {
  test("nothing missing: nothing to do", () => {
    expect(run(process.env.PATH!)).toEqual({ code: 0, err: "" });
  });

  test.skipIf(process.getuid?.() !== 0)("missing, as root with apt-get: each package installed once, in one apt-get call", () => {
    const { bin, log } = bareBin("ok");
    const r = run(bin);
    expect(r.code).toBe(0);
    expect(r.err).toBe(`npm test: installing system packages the tests use: ${all}`);
    expect(readFileSync(log, "utf8").trim().split("\n")).toEqual(["update -qq", `install -y -qq ${all}`]);
  });

  test.skipIf(process.getuid?.() !== 0)("apt-get fails: the tests do not start, and one line says what is missing", () => {
    const r = run(bareBin("fails").bin);
    expect(r.code).toBe(1);
    expect(r.err.split("\n").at(-1)).toBe(`npm test: apt-get could not install: ${all} (install them, or set KEYOP_SKIP_SYSTEM_DEPS=1)`);
  });

  test("no apt-get: one line with what to install", () => {
    const r = run(bareBin(null).bin);
    expect(r.code).toBe(1);
    expect(r.err).toBe(`npm test needs system packages: sudo apt-get install ${all} (or set KEYOP_SKIP_SYSTEM_DEPS=1)`);
  });

  test("KEYOP_SKIP_SYSTEM_DEPS=1 skips the check", () => {
    expect(run(bareBin(null).bin, { KEYOP_SKIP_SYSTEM_DEPS: "1" })).toEqual({ code: 0, err: "" });
  });
});
