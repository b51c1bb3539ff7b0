/**
 * The peer servers of the comparison benchmarks (Mosquitto, nats-server),
 * alone and as three-server setups (bridges, leaf nodes), each with its
 * config from bench/configs/ under one scratch directory; and the /proc
 * readings every benchmark takes of a server (CPU, wake-ups).
 */
import { mkdirSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createCa, issueCert } from "../src/pki/certs.ts";
import { freePort } from "../test/ports.ts";
import { portOpen, spawnReady, stopProc, type Proc } from "./procs.ts";

const CONFIGS = join(import.meta.dir, "configs");

/** A server process and the TCP port its clients use. */
export interface Server {
  proc: Proc;
  port: number;
}

/** A server started from a config file (kept, to start it again). */
export interface ConfServer extends Server {
  conf: string;
}

/** apt-get installs the Debian packages whose commands are missing. */
export function ensureInstalled(commands: Record<string, string> = { mosquitto: "mosquitto", "nats-server": "nats-server" }): void {
  const need = Object.entries(commands)
    .filter(([cmd]) => !Bun.which(cmd, { PATH: `/usr/sbin:/usr/bin:${process.env.PATH}` }))
    .map(([, pkg]) => pkg);
  if (need.length === 0) return;
  console.log(`installing ${need.join(", ")} (apt-get)`);
  Bun.spawnSync(["apt-get", "update", "-qq"], { stdout: "ignore", stderr: "inherit" });
  const r = Bun.spawnSync(["apt-get", "install", "-y", "-qq", ...need], { stdout: "ignore", stderr: "inherit" });
  if (r.exitCode !== 0) throw new Error(`apt-get install ${need.join(" ")} failed`);
}

export const bin = (name: string) => Bun.which(name, { PATH: `/usr/sbin:/usr/bin:${process.env.PATH}` }) ?? name;

export { freePort };

/** A config from bench/configs with {{KEY}} filled in, written to `path`. */
export function config(template: string, vars: Record<string, string | number>, path: string, append = ""): string {
  let text = readFileSync(join(CONFIGS, template), "utf8");
  for (const [k, v] of Object.entries(vars)) text = text.replaceAll(`{{${k}}}`, String(v));
  writeFileSync(path, text + append);
  return path;
}

/** Starts and stops peer servers under `root`; `started` holds every one still running. */
export class Servers {
  constructor(
    readonly root: string,
    readonly started: Set<Proc>,
  ) {}

  dir(name: string): string {
    const d = join(this.root, name);
    mkdirSync(d, { recursive: true });
    return d;
  }

  async server(cmd: string[], port: number, what: string): Promise<Server> {
    return { proc: await spawnReady(cmd, portOpen(port), what, { group: this.started }), port };
  }

  async kill(s: { proc: Proc }, signal: "SIGTERM" | "SIGKILL" = "SIGTERM"): Promise<void> {
    await stopProc(s.proc, signal, this.started);
  }

  /** Starts `program` again on the config and port of `s` (after it was stopped). */
  async restart(s: ConfServer, program: "mosquitto" | "nats-server"): Promise<ConfServer> {
    return { ...(await this.server([bin(program), "-c", s.conf], s.port, `${program} again`)), conf: s.conf };
  }

  async mosquitto(name: string, append = "", port = freePort()): Promise<ConfServer> {
    const d = this.dir(name);
    const conf = config("mosquitto.conf", { PORT: port, DIR: d }, join(d, "mosquitto.conf"), append);
    return { ...(await this.server([bin("mosquitto"), "-c", conf], port, `mosquitto ${name}`)), conf };
  }

  async natsJs(name: string, port = freePort()): Promise<ConfServer> {
    const d = this.dir(name);
    const conf = config("nats-js.conf", { PORT: port, DIR: join(d, "js") }, join(d, "nats.conf"));
    return { ...(await this.server([bin("nats-server"), "-c", conf], port, `nats ${name}`)), conf };
  }

  /**
   * A hub Mosquitto and two edges bridged to it at QoS 1: `a` sends bench/#
   * out, `b` takes it in. With `tls`, the bridges connect to a second
   * listener of the hub over mutual TLS (certificates of one CA, as keyop's
   * links); clients still use the plain listeners.
   */
  async mosquittoTrio(tag: string, opts: { tls?: boolean } = {}): Promise<{ hub: ConfServer; a: ConfServer; b: ConfServer }> {
    const tls = opts.tls ? await writeTrioCerts(this.dir(`${tag}-certs`)) : undefined;
    // Started as root, Mosquitto reads its certificates after switching to its own user, which
    // cannot enter the scratch directory (mode 0700): it keeps root for the TLS variant.
    const asRoot = tls ? "\nuser root\n" : "";
    const port = freePort();
    let tlsPort = freePort();
    while (tlsPort === port) tlsPort = freePort();
    const hub = await this.mosquitto(
      `${tag}-hub`,
      tls ? `\nlistener ${tlsPort} 127.0.0.1\ncafile ${tls.ca}\ncertfile ${tls.hub.cert}\nkeyfile ${tls.hub.key}\nrequire_certificate true\n${asRoot}` : "",
      port,
    );
    const bridge = (name: "a" | "b", direction: string) =>
      "\n" +
      readFileSync(join(CONFIGS, "mosquitto-bridge.conf"), "utf8")
        .replaceAll("{{HUB_PORT}}", String(tls ? tlsPort : hub.port))
        .replaceAll("{{DIRECTION}}", direction)
        .replaceAll("{{NAME}}", `${tag}-${name}`) +
      asRoot +
      (tls ? `bridge_cafile ${tls.ca}\nbridge_certfile ${tls[name].cert}\nbridge_keyfile ${tls[name].key}\n` : "");
    const a = await this.mosquitto(`${tag}-a`, bridge("a", "out"));
    const b = await this.mosquitto(`${tag}-b`, bridge("b", "in"));
    return { hub, a, b };
  }

  /** A hub nats-server and two leaf nodes connected to it. */
  async natsTrio(tag: string): Promise<{ hub: ConfServer; a: Server; b: Server; leafPort: number }> {
    const leafPort = freePort();
    const hubPort = freePort();
    const hubConf = config("nats-hub.conf", { PORT: hubPort, LEAF_PORT: leafPort }, join(this.dir(`${tag}-hub`), "nats.conf"));
    const hub = { ...(await this.server([bin("nats-server"), "-c", hubConf], hubPort, "nats hub")), conf: hubConf };
    const leaf = async (name: string) => {
      const port = freePort();
      const conf = config("nats-leaf.conf", { PORT: port, LEAF_PORT: leafPort }, join(this.dir(`${tag}-${name}`), "nats.conf"));
      return this.server([bin("nats-server"), "-c", conf], port, `nats ${name}`);
    };
    return { hub, a: await leaf("a"), b: await leaf("b"), leafPort };
  }
}

/** A CA and certificates for a hub and two edges (P-256, for 127.0.0.1), as PEM files in `dir`. */
/** A CA and certificates for a hub and two edges (P-256, for 127.0.0.1), as PEM files in `dir`. */
export async function writeTrioCerts(dir: string) {
  const ca = await createCa();
  writeFileSync(join(dir, "ca.pem"), ca.certPem);
  const files = async (name: string) => {
    const c = await issueCert(ca, { name, ip: ["127.0.0.1"] });
    const f = { cert: join(dir, `${name}.pem`), key: join(dir, `${name}.key`) };
    writeFileSync(f.cert, c.certPem);
    writeFileSync(f.key, c.keyPem);
    return f;
  };
  return { ca: join(dir, "ca.pem"), hub: await files("hub"), a: await files("a"), b: await files("b") };
}

/** CPU seconds (user + system) of a process so far, from /proc/PID/stat (10 ms ticks). */
export function cpuOf(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;
}

/** What a thread of a Bun process does, from its name; every thread of a C or Go server is "main". */
export type ThreadKind = "main" | "jit" | "gc" | "allocator" | "pool";

export function threadKind(comm: string): ThreadKind {
  if (/^(JITWorker|JSCWarmUp|JIT)/.test(comm)) return "jit";
  if (/^(HeapHelper|.*ollector Thread|Heap)/.test(comm)) return "gc";
  if (/^mi-/.test(comm)) return "allocator";
  if (/^Bun Pool/.test(comm)) return "pool";
  return "main";
}

/** What the scheduler has counted so far for each thread of some processes, and their CPU ticks. */
export interface ProcSnapshot {
  /** By "pid/tid": nanoseconds on CPU (schedstat), voluntary context switches, kind. */
  threads: Map<string, { ns: number; wakeups: number; kind: ThreadKind }>;
  /** utime + stime of the processes in seconds (/proc/PID/stat: 10 ms ticks, threads that ended included). */
  ticks: number;
}

/** What happened between two snapshots. */
export interface ProcCost {
  /** CPU seconds, user + system. */
  cpu: number;
  /** Voluntary context switches: each is a sleep that something later ended. */
  wakeups: number;
  /** CPU seconds by kind of thread. */
  byKind: Partial<Record<ThreadKind, number>>;
  /** Voluntary context switches by kind of thread. */
  wakeupsByKind: Partial<Record<ThreadKind, number>>;
  /** CPU seconds (the threads' sum) by process id. */
  byPid: Map<number, number>;
}

export function snapshotOf(pids: number[]): ProcSnapshot {
  const threads: ProcSnapshot["threads"] = new Map();
  let ticks = 0;
  for (const pid of pids) {
    ticks += cpuOf(pid);
    for (const t of readdirSync(`/proc/${pid}/task`)) {
      try {
        const ns = Number(readFileSync(`/proc/${pid}/task/${t}/schedstat`, "utf8").split(" ")[0]);
        const kind = threadKind(readFileSync(`/proc/${pid}/task/${t}/comm`, "utf8").trim());
        const m = /\nvoluntary_ctxt_switches:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/task/${t}/status`, "utf8"));
        threads.set(`${pid}/${t}`, { ns, wakeups: m ? Number(m[1]) : 0, kind });
      } catch {
        // the thread ended between the listing and the read
      }
    }
  }
  return { threads, ticks };
}

/**
 * `next`, with the threads that `prev` saw and `next` does not (they ended
 * in between) kept at what `prev` read of them. Sampling a process every
 * second this way keeps most of the wake-ups of a thread that lives for
 * seconds only: JavaScriptCore starts a marking helper for a collection and
 * lets it exit some 10 s later, and a window read only at its two ends
 * counts such a thread's wake-ups or not by where the window falls.
 */
export function withEnded(prev: ProcSnapshot, next: ProcSnapshot): ProcSnapshot {
  const threads = new Map(next.threads);
  for (const [id, t] of prev.threads) if (!threads.has(id)) threads.set(id, t);
  return { threads, ticks: next.ticks };
}

/**
 * The cost between `a` and `b`, thread by thread: a thread that started
 * counts from zero, one that ended is missing from `b`. Its nanoseconds are
 * lost with it (a JIT worker exits when it has nothing to compile), so the
 * CPU is the larger of the threads' sum and the ticks, which keep what
 * ended threads used at 10 ms resolution; its wake-ups are lost.
 */
export function costBetween(a: ProcSnapshot, b: ProcSnapshot): ProcCost {
  let ns = 0;
  let wakeups = 0;
  const byKind: Partial<Record<ThreadKind, number>> = {};
  const wakeupsByKind: Partial<Record<ThreadKind, number>> = {};
  const byPid = new Map<number, number>();
  for (const [id, t] of b.threads) {
    const before = a.threads.get(id);
    const dns = t.ns - (before?.ns ?? 0);
    ns += dns;
    const pid = Number(id.split("/")[0]);
    byPid.set(pid, (byPid.get(pid) ?? 0) + dns / 1e9);
    const dw = t.wakeups - (before?.wakeups ?? 0);
    wakeups += dw;
    wakeupsByKind[t.kind] = (wakeupsByKind[t.kind] ?? 0) + dw;
    byKind[t.kind] = (byKind[t.kind] ?? 0) + dns / 1e9;
  }
  const ticks = b.ticks - a.ticks;
  return { cpu: ticks > ns / 1e9 + 0.02 ? ticks : ns / 1e9, wakeups, byKind, wakeupsByKind, byPid };
}
