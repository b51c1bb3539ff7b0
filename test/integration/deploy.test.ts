import { describe, expect, test } from "bun:test";
import { chmodSync, copyFileSync, mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { BUN, MAIN, tmpDir } from "../helpers.ts";

const ROOT = join(import.meta.dir, "..", "..");
const DEPLOY = join(ROOT, "deploy");

/** The shell blocks of docs/deploy.md's "Try it on one machine" section, in order. */
function trialSteps(): string {
  const doc = readFileSync(join(ROOT, "docs", "deploy.md"), "utf8");
  const start = doc.indexOf("## Try it on one machine");
  const end = doc.indexOf("\n## ", start + 1);
  const section = doc.slice(start, end < 0 ? undefined : end);
  const blocks = [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!);
  expect(blocks.length).toBeGreaterThanOrEqual(4);
  return blocks.join("\n");
}

/** Owner, mode and content hash of every path under `root`. */
function snapshot(root: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (dir: string) => {
    for (const name of readdirSync(dir)) {
      const p = join(dir, name);
      const st = statSync(p);
      const what = st.isDirectory() ? "dir" : new Bun.CryptoHasher("sha256").update(readFileSync(p)).digest("hex").slice(0, 16);
      out[relative(root, p)] = `${(st.mode & 0o7777).toString(8)} ${st.uid}:${st.gid} ${what}`;
      if (st.isDirectory()) walk(p);
    }
  };
  walk(root);
  return out;
}

describe("deployment", () => {
  test("docs/deploy.md's one-machine steps, run as written: a hub and two devices exchange messages", async () => {
    const dir = tmpDir();
    const bin = join(dir, "bin");
    mkdirSync(bin);
    writeFileSync(join(bin, "keyop"), `#!/bin/sh\nexec "${BUN}" "${MAIN}" "$@"\n`);
    chmodSync(join(bin, "keyop"), 0o755);
    const script = `set -e\ntrap 'kill $(jobs -p) 2>/dev/null' EXIT\n${trialSteps()}`;
    const proc = Bun.spawn(["timeout", "120", "bash", "-c", script], {
      cwd: dir,
      env: { ...process.env, PATH: `${bin}:${process.env.PATH}`, KEYOP_DEPLOY: DEPLOY, KEYOP_SOCKET: "" },
      stdout: "pipe",
      stderr: "pipe",
    });
    const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
    expect({ code, err: code === 0 ? "" : err }).toEqual({ code: 0, err: "" });
    const envelopes = out
      .split("\n")
      .filter((l) => l.startsWith("{") && l.includes('"route"'))
      .map((l) => JSON.parse(l));
    const reading = envelopes.find((e) => e.channel === "telemetry.board-1.temp");
    const command = envelopes.find((e) => e.channel === "cmd.board-1.fan");
    expect(reading).toMatchObject({ origin: "board-1", route: ["board-1", "hub", "board-2"], payload: { celsius: 21.5 } });
    expect(command).toMatchObject({ origin: "hub", route: ["hub", "board-1"], payload: { on: true } });
    // The status printed in the steps shows board-1's link.
    expect(out).toContain("board-1");
  }, 150_000);

  test("install.sh: user, directories and modes, config and unit; a second run changes nothing", async () => {
    const root = tmpDir();
    mkdirSync(join(root, "etc"));
    for (const f of ["passwd", "group", "shadow", "gshadow"]) {
      try {
        copyFileSync(join("/etc", f), join(root, "etc", f));
      } catch {
        // not every system has gshadow
      }
    }
    const fake = join(root, "..", `keyop-binary-${Date.now()}`);
    writeFileSync(fake, "#!/bin/sh\necho keyop\n");
    const run = (extra: string[] = []) => Bun.spawnSync(["sh", join(DEPLOY, "install.sh"), "--root", root, "--binary", fake, ...extra], { stdout: "pipe", stderr: "pipe" });
    const first = run(["--role", "device"]);
    expect(first.exitCode).toBe(0);
    expect(first.stdout.toString()).toContain("created user keyop");
    const passwd = readFileSync(join(root, "etc", "passwd"), "utf8")
      .split("\n")
      .find((l) => l.startsWith("keyop:"))!;
    const [, , uid, gid, , home] = passwd.split(":");
    expect(home).toBe("/var/lib/keyop");
    const snap = snapshot(root);
    expect(snap["etc/keyop"]).toBe(`750 0:${gid} dir`);
    expect(snap["etc/keyop/pki"]).toBe(`750 0:${gid} dir`);
    expect(snap["var/lib/keyop"]).toBe(`750 ${uid}:${gid} dir`);
    expect(snap["usr/local/bin/keyop"]!.startsWith("755 0:0 ")).toBe(true);
    expect(readFileSync(join(root, "etc/keyop/keyop.yaml"), "utf8")).toBe(readFileSync(join(DEPLOY, "device.yaml"), "utf8"));
    expect(readFileSync(join(root, "etc/systemd/system/keyop.service"), "utf8")).toBe(readFileSync(join(DEPLOY, "keyop.service"), "utf8"));

    const second = run(["--role", "hub"]);
    expect(second.exitCode).toBe(0);
    expect(second.stdout.toString().trim()).toBe("install.sh: nothing to change");
    expect(snapshot(root)).toEqual(snap);

    // An operator's edited config is never replaced; a drifted mode is put back.
    writeFileSync(join(root, "etc/keyop/keyop.yaml"), "name: edited\n");
    chmodSync(join(root, "var/lib/keyop"), 0o777);
    const third = run();
    expect(third.stdout.toString()).toContain("mode 750 on");
    expect(readFileSync(join(root, "etc/keyop/keyop.yaml"), "utf8")).toBe("name: edited\n");
  });

  test("the example configs are valid as shipped and the unit passes systemd-analyze verify", async () => {
    const { loadConfig } = await import("../../src/config/schema.ts");
    for (const f of ["hub.yaml", "device.yaml"]) {
      const cfg = await loadConfig(join(DEPLOY, f));
      expect(cfg.tls?.cert.startsWith("/etc/keyop/pki/")).toBe(true);
    }
    const analyze = Bun.which("systemd-analyze");
    if (!analyze) {
      console.log("systemd-analyze not installed: unit not verified");
      return;
    }
    // Verify with the binary's path pointed at an executable that exists here.
    const dir = tmpDir();
    const unit = join(dir, "keyop.service");
    writeFileSync(unit, readFileSync(join(DEPLOY, "keyop.service"), "utf8").replaceAll("/usr/local/bin/keyop", "/bin/true"));
    const r = Bun.spawnSync([analyze, "verify", unit], { stdout: "pipe", stderr: "pipe" });
    expect({ code: r.exitCode, out: (r.stdout.toString() + r.stderr.toString()).trim() }).toEqual({ code: 0, out: "" });
  });
});
