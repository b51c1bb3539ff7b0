/**
 * Version and commit of this build. `build/` replaces KEYOP_COMMIT at
 * compile time (bun build --define); from source it reads git if present.
 */
import pkg from "../package.json" with { type: "json" };

declare const KEYOP_COMMIT: string | undefined;

/** Semantic version from package.json. */
export const VERSION: string = pkg.version;

/** Git commit the binary was built from, or "dev". */
export const COMMIT: string = typeof KEYOP_COMMIT === "string" ? KEYOP_COMMIT : gitCommit();

function gitCommit(): string {
  try {
    const r = Bun.spawnSync(["git", "rev-parse", "--short", "HEAD"], { cwd: import.meta.dir, stderr: "ignore" });
    const out = r.stdout.toString().trim();
    return r.exitCode === 0 && out ? out : "dev";
  } catch {
    return "dev";
  }
}
