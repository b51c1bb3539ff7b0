/**
 * Three `keyop run` processes (device A, hub, device B) with links over
 * mutual TLS, and the helpers to drive them: shared by the federation
 * benchmark and the comparison with Mosquitto and NATS.
 */
import { writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import { createCa, issueCert } from "../src/pki/certs.ts";
import { freePort } from "../test/ports.ts";
import { agentHealthy, spawnReady, stopProc, until } from "./procs.ts";
import { RawHttp } from "./raw-http.ts";

export { until };

export const MAIN = join(import.meta.dir, "..", "src", "main.ts");
const _CLIENTS = 100;

/** A `keyop run` child and its API socket. */
export interface Proc {
  proc: ReturnType<typeof Bun.spawn>;
  socket: string;
}

/**
 * Extra arguments to Bun for every agent a benchmark starts, from
 * KEYOP_BENCH_BUN_ARGS: `--cpu-prof --cpu-prof-dir=/tmp/p` profiles each
 * agent of a workload (docs/benchmarks.md, "Profiling"). With
 * KEYOP_BENCH_STDERR_DIR set, each agent's stderr goes to a file of its own
 * there (`<data dir>-<name>.stderr`), for runtime logs such as BUN_JSC_logGC.
 */
export function bunArgs(): string[] {
  return (process.env.KEYOP_BENCH_BUN_ARGS ?? "").split(" ").filter(Boolean);
}

/** Which build an agent runs and what it adds to its environment (A/B of two work trees, or of an option). */
export interface Build {
  /** The entry point: src/main.ts of a work tree (this one's by default). */
  main?: string;
  env?: Record<string, string>;
}

/** Starts `keyop run` with `yaml` (plus data dir, socket and log level) and waits for its socket. */
export async function start(dir: string, name: string, yaml: string, sync = "always", build: Build = {}): Promise<Proc> {
  const cfg = join(dir, `${name}.yaml`);
  const socket = join(dir, `${name}.sock`);
  writeFileSync(cfg, `storage:\n  data_dir: ${join(dir, name)}\n  sync: ${sync}\napi:\n  socket: ${socket}\nlog:\n  level: warn\n${yaml}`);
  const errDir = process.env.KEYOP_BENCH_STDERR_DIR;
  const stderr = errDir ? Bun.file(join(errDir, `${basename(dir)}-${name}.stderr`)) : "inherit";
  const proc = await spawnReady([process.execPath, ...bunArgs(), build.main ?? MAIN, "run", "--config", cfg], agentHealthy(socket), `keyop ${name}`, { stderr, env: build.env });
  return { proc, socket };
}

/** Stops an agent (SIGTERM) and waits for it. */
export async function stop(p: Proc): Promise<void> {
  await stopProc(p.proc);
}

/** The agent's /v1/status. */
export async function status(p: Proc): Promise<any> {
  return (await fetch("http://k/v1/status", { unix: p.socket } as RequestInit)).json();
}

/** Messages stored on `channel` at `p`. */
export async function channelMessages(p: Proc, channel: string): Promise<number> {
  const list = ((await (await fetch("http://k/v1/channels", { unix: p.socket } as RequestInit)).json()) as { channels: { channel: string; messages: number }[] }).channels;
  return list.find((c) => c.channel === channel)?.messages ?? 0;
}

/** Counts NDJSON stream lines of `channel` on `p` (auto-acked), calling `each` per message. */
export function streamCount(p: Proc, channel: string, each: (m: any) => void): { stop: () => void } {
  const ctl = new AbortController();
  void (async () => {
    const res = await fetch(`http://k/v1/channels/${channel}/stream?subscriber=bench&from=earliest&auto_ack=true`, { unix: p.socket, signal: ctl.signal } as RequestInit);
    const dec = new TextDecoder();
    let rest = "";
    try {
      for await (const chunk of res.body as AsyncIterable<Uint8Array>) {
        rest += dec.decode(chunk, { stream: true });
        const lines = rest.split("\n");
        rest = lines.pop()!;
        for (const l of lines) if (l) each(JSON.parse(l));
      }
    } catch {
      // aborted
    }
  })();
  return { stop: () => ctl.abort() };
}

/**
 * Publishes `total` messages to `channel` at `rate` per second over `conns`
 * (as many requests in flight as connections at most), each carrying its
 * wall-clock send time in `payload.t`.
 */
export async function paced(conns: RawHttp[], total: number, rate = 1000, channel = "t.lat"): Promise<void> {
  const t0 = performance.now();
  let sent = 0;
  const inflight: Promise<unknown>[] = [];
  while (sent < total) {
    const due = Math.min(total, Math.floor(((performance.now() - t0) * rate) / 1000) + 1);
    while (sent < due) {
      const c = conns[sent % conns.length]!;
      const body = JSON.stringify({ type: "n", payload: { t: performance.timeOrigin + performance.now(), pad: "x".repeat(200) } });
      inflight.push(c.send(RawHttp.request("POST", `/v1/channels/${channel}/messages`, body)));
      sent++;
      if (inflight.length >= conns.length) await Promise.all(inflight.splice(0));
    }
    // Sleep until the next message is due (a sub-millisecond sleep spins and took a core from the agents).
    await Bun.sleep(Math.max(1, t0 + (sent * 1000) / rate - performance.now()));
  }
  await Promise.all(inflight);
}

/** Three agents linked A -> hub -> B on channels `pattern`, and what it takes to restart the hub. */
export interface Trio {
  dir: string;
  port: number;
  hub: Proc;
  devA: Proc;
  devB: Proc;
  hubYaml: string;
  /** Storage sync mode of all three. */
  sync: string;
}

/**
 * Makes a CA and certificates (hub, devA, devB and `extraPeers` more names,
 * allowed nothing), starts the hub and both devices with `sync` on every
 * hop, and waits until both links are open. `compression`: the devices'
 * `federation.compression` (the default, `auto`, when not given).
 */
export async function startTrio(
  dir: string,
  opts: { pattern?: string; extraPeers?: string[]; sync?: string; compression?: string; deviceYaml?: (name: "devA" | "devB") => string; build?: Build } = {},
): Promise<Trio> {
  const pattern = opts.pattern ?? "t.>";
  const extra = opts.extraPeers ?? [];
  const ca = await createCa();
  writeFileSync(join(dir, "ca.crt"), ca.certPem);
  for (const n of ["hub", "devA", "devB", ...extra]) {
    const c = await issueCert(ca, { name: n, ip: ["127.0.0.1"] });
    writeFileSync(join(dir, `${n}.crt`), c.certPem);
    writeFileSync(join(dir, `${n}.key`), c.keyPem);
  }
  const storage = opts.sync ?? "always";
  const tls = (n: string) => `tls:\n  cert: ${dir}/${n}.crt\n  key: ${dir}/${n}.key\n  ca: ${dir}/ca.crt\n`;
  const port = freePort();
  const peers = [
    `    - name: devA\n      publish: ['${pattern}']\n      subscribe: []`,
    `    - name: devB\n      publish: []\n      subscribe: ['${pattern}']`,
    ...extra.map((n) => `    - name: ${n}\n      publish: []\n      subscribe: []`),
  ];
  const hubYaml = tls("hub") + `hub:\n  listen: 127.0.0.1:${port}\n  peers:\n${peers.join("\n")}\n`;
  const fedOpts = `federation:\n  reconnect_base_ms: 100ms\n  reconnect_max_ms: 500ms\n${opts.compression ? `  compression: ${opts.compression}\n` : ""}`;
  const extraYaml = opts.deviceYaml ?? (() => "");
  // One that fails to start takes the ones already started with it: none is left running.
  const started: Proc[] = [];
  try {
    const hub = await start(dir, "hub", hubYaml, storage, opts.build);
    started.push(hub);
    const devA = await start(dir, "devA", tls("devA") + fedOpts + extraYaml("devA") + `links:\n  - hub: 127.0.0.1:${port}\n    publish: ['${pattern}']\n    subscribe: []\n`, storage, opts.build);
    started.push(devA);
    const devB = await start(dir, "devB", tls("devB") + fedOpts + extraYaml("devB") + `links:\n  - hub: 127.0.0.1:${port}\n    publish: []\n    subscribe: ['${pattern}']\n`, storage, opts.build);
    started.push(devB);
    await until("links open", async () => (await status(devA)).links[0]?.state === "open" && (await status(devB)).links[0]?.state === "open");
    return { dir, port, hub, devA, devB, hubYaml, sync: storage };
  } catch (err) {
    for (const p of started) await stop(p);
    throw err;
  }
}
