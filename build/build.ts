/**
 * `npm run build`: one self-contained keyop executable per target, with
 * `bun build --compile` (minified, bytecode-compiled), the version from
 * package.json and the git commit embedded, and a SHA256SUMS file.
 *
 *   bun build/build.ts [--targets x64,arm64,x64-musl,arm64-musl] [--out dist]
 *
 * Cross-compiling needs the target's Bun runtime, which bun fetches from the
 * npm registry the first time (then it is cached).
 */
import { mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";

/** The targets `npm run build` makes, by short name. */
export const TARGETS: Record<string, string> = {
  x64: "bun-linux-x64",
  arm64: "bun-linux-arm64",
  "x64-musl": "bun-linux-x64-musl",
  "arm64-musl": "bun-linux-arm64-musl",
};

const root = join(import.meta.dir, "..");

function flag(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  if (i >= 0) return process.argv[i + 1];
  return process.argv.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3);
}

/** The commit to embed: $KEYOP_COMMIT, else git's short hash (with "-dirty" for local changes), else "dev". */
function commit(): string {
  if (process.env.KEYOP_COMMIT) return process.env.KEYOP_COMMIT;
  const head = Bun.spawnSync(["git", "rev-parse", "--short", "HEAD"], { cwd: root, stderr: "ignore" });
  if (head.exitCode !== 0) return "dev";
  const dirty = Bun.spawnSync(["git", "status", "--porcelain", "--untracked-files=no"], { cwd: root, stderr: "ignore" }).stdout.toString().trim() !== "";
  return head.stdout.toString().trim() + (dirty ? "-dirty" : "");
}

function compile(target: string, out: string, sha: string, bytecode: boolean): { ok: boolean; log: string } {
  const args = [process.execPath, "build", "--compile", "--minify", `--target=${target}`, "--define", `KEYOP_COMMIT=${JSON.stringify(sha)}`, join(root, "src", "main.ts"), "--outfile", out];
  if (bytecode) args.splice(4, 0, "--bytecode");
  const r = Bun.spawnSync(args, { cwd: root, stdout: "pipe", stderr: "pipe" });
  return { ok: r.exitCode === 0, log: r.stdout.toString() + r.stderr.toString() };
}

async function main(): Promise<number> {
  const names = (flag("targets") ?? Object.keys(TARGETS).join(",")).split(",").filter(Boolean);
  for (const n of names) if (!TARGETS[n]) throw new Error(`unknown target ${n} (known: ${Object.keys(TARGETS).join(", ")})`);
  const outDir = join(root, flag("out") ?? "dist");
  mkdirSync(outDir, { recursive: true });
  const sha = commit();
  const version = (JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as { version: string }).version;
  console.log(`keyop ${version} (commit ${sha}): building ${names.join(", ")} into ${outDir}`);
  const sums: string[] = [];
  for (const n of names) {
    const out = join(outDir, `keyop-linux-${n}`);
    const t0 = performance.now();
    let bytecode = true;
    let r = compile(TARGETS[n]!, out, sha, true);
    if (!r.ok) {
      // Bytecode depends on every module compiling ahead of time; fall back rather than ship nothing.
      console.warn(`  ${n}: --bytecode failed, building without it:\n${r.log.trim().split("\n").slice(-3).join("\n")}`);
      bytecode = false;
      r = compile(TARGETS[n]!, out, sha, false);
    }
    if (!r.ok) {
      console.error(`  ${n}: build failed:\n${r.log}`);
      return 1;
    }
    const bytes = readFileSync(out);
    const hash = new Bun.CryptoHasher("sha256").update(bytes).digest("hex");
    sums.push(`${hash}  ${basename(out)}`);
    console.log(`  ${basename(out).padEnd(24)} ${(statSync(out).size / 1e6).toFixed(1).padStart(6)} MB  ${bytecode ? "bytecode" : "no bytecode"}  ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  }
  writeFileSync(join(outDir, "SHA256SUMS"), sums.join("\n") + "\n");
  console.log(`  SHA256SUMS (check with: cd ${outDir} && sha256sum -c SHA256SUMS)`);
  return 0;
}

process.exit(await main());
