/**
 * Two builds of keyop side by side on HTTP publishes: an A/B of a change
 * to the HTTP path that holds up while this machine's speed drifts.
 *
 *   bun bench/http-pair.ts --a=<work tree> --b=<work tree> [--sync=none|always] [--pairs=30] [--secs=1.5]
 *
 * Both agents run at once, each on a fresh data directory; 64 keep-alive
 * connections send single-message publishes to one of them for `secs`,
 * then to the other, in the order A B, B A, A B... so that a drift of the
 * machine within a pair falls on both. Per burst: the agent's CPU (utime +
 * stime from /proc) per message and its rate. It prints each pair and one
 * JSON line: the medians of B/A for CPU per message and for the rate, and
 * how many pairs had B's CPU lower. At 64 connections the agent is bound
 * by its own CPU (`sync: none`) or by its fdatasyncs (`always`).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { publishRate } from "./api.ts";
import { alternating, quantile } from "./lib.ts";
import { agentHealthy, spawnReady, stopProc } from "./procs.ts";
import { cpuOf } from "./servers.ts";

const arg = (name: string, def?: string): string => {
  const v = process.argv.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? def;
  if (v === undefined) throw new Error(`--${name}=... is required`);
  return v;
};
const trees = { a: resolve(arg("a")), b: resolve(arg("b")) };
const sync = arg("sync", "none");
const pairs = Number(arg("pairs", "30"));
const secs = Number(arg("secs", "1.5"));
const CONNECTIONS = 64;

interface Side {
  dir: string;
  socket: string;
  proc: ReturnType<typeof Bun.spawn>;
}

async function start(tree: string): Promise<Side> {
  const dir = mkdtempSync(join(process.env.KEYOP_BENCH_DIR ?? tmpdir(), "keyop-http-pair-"));
  const cfg = join(dir, "k.yaml");
  const socket = join(dir, "k.sock");
  await Bun.write(cfg, `storage:\n  data_dir: ${dir}/data\n  sync: ${sync}\napi:\n  socket: ${socket}\nlog:\n  level: warn\n`);
  const proc = await spawnReady([process.execPath, join(tree, "src", "main.ts"), "run", "--config", cfg], agentHealthy(socket), `keyop agent of ${tree}`, { stderr: "inherit" });
  return { dir, socket, proc };
}

async function burst(s: Side): Promise<{ us: number; rate: number }> {
  const c0 = cpuOf(s.proc.pid);
  const r = await publishRate(s.socket, CONNECTIONS, secs);
  return { us: ((cpuOf(s.proc.pid) - c0) * 1e6) / (r.rate * secs), rate: r.rate };
}

const a = await start(trees.a);
const b = await start(trees.b);
try {
  // Past the JIT's warm-up on both before anything is counted.
  for (const s of [a, b]) await publishRate(s.socket, CONNECTIONS, 4);
  const cpu: number[] = [];
  const rate: number[] = [];
  await alternating(
    pairs,
    () => burst(a),
    () => burst(b),
    (x, y, i) => {
      cpu.push(y.us / x.us);
      rate.push(y.rate / x.rate);
      console.log(`pair ${i + 1}: A ${x.us.toFixed(1)} µs/msg ${Math.round(x.rate)} msg/s, B ${y.us.toFixed(1)} µs/msg ${Math.round(y.rate)} msg/s`);
    },
  );
  const lower = cpu.filter((r) => r < 1).length;
  console.log(
    JSON.stringify({
      workload: `http publish, ${CONNECTIONS} connections, side by side`,
      sync,
      pairs,
      secs,
      cpuBOverA: +quantile([...cpu], 0.5).toFixed(3),
      rateBOverA: +quantile([...rate], 0.5).toFixed(3),
      pairsWithBLower: lower,
      a: trees.a,
      b: trees.b,
    }),
  );
} finally {
  for (const s of [a, b]) {
    await stopProc(s.proc);
    rmSync(s.dir, { recursive: true, force: true });
  }
}
