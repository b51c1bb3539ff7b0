/**
 * A real 3-node NATS JetStream cluster on loopback for tests: each node its
 * own process, config and store directory, stopped and started by PID.
 * nats-server 2.9 needs `server_name` and `cluster.name` for clustering.
 * Self-contained (no test-runner hooks), so the benchmarks use it too.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { connect, type NatsConnection } from "nats";
import { freePort } from "../ports.ts";

/** Polls `cond` until true, or throws naming `what` after `timeoutMs`. */
async function waitFor(cond: () => Promise<boolean>, what: string, timeoutMs: number, everyMs: number): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!(await cond())) {
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await Bun.sleep(everyMs);
  }
}

/** One node of the cluster. */
export interface NatsNode {
  name: string;
  port: number;
  conf: string;
  proc: ReturnType<typeof Bun.spawn> | null;
}

function natsServer(): string {
  return Bun.which("nats-server", { PATH: `/usr/sbin:/usr/bin:${process.env.PATH}` }) ?? "nats-server";
}

/** A running cluster: its nodes, their client URLs, and stop/start of one node. */
export class NatsCluster {
  readonly nodes: NatsNode[];

  private constructor(nodes: NatsNode[]) {
    this.nodes = nodes;
  }

  /** Starts `size` nodes in `dir` and waits until JetStream answers (a meta leader was elected). */
  static async start(dir: string, size = 3, onSpawn?: (p: ReturnType<typeof Bun.spawn>) => void): Promise<NatsCluster> {
    const ports = Array.from({ length: size }, () => ({ client: freePort(), route: freePort() }));
    const nodes: NatsNode[] = ports.map((p, i) => {
      const name = `n${i + 1}`;
      const d = join(dir, name);
      mkdirSync(d, { recursive: true });
      const routes = ports.filter((_, k) => k !== i).map((q) => `nats-route://127.0.0.1:${q.route}`);
      const conf = join(d, "nats.conf");
      writeFileSync(
        conf,
        [
          `server_name: ${name}`,
          `listen: 127.0.0.1:${p.client}`,
          `jetstream { store_dir: "${join(d, "js")}" }`,
          `cluster { name: keyop-test, listen: 127.0.0.1:${p.route}, routes: [${routes.join(", ")}] }`,
          "",
        ].join("\n"),
      );
      return { name, port: p.client, conf, proc: null };
    });
    const c = new NatsCluster(nodes);
    c.onSpawn = onSpawn;
    for (const n of nodes) c.startNode(n.name);
    await c.waitReady();
    return c;
  }

  /** Client URLs of every node. */
  get servers(): string[] {
    return this.nodes.map((n) => `nats://127.0.0.1:${n.port}`);
  }

  node(name: string): NatsNode {
    const n = this.nodes.find((x) => x.name === name);
    if (!n) throw new Error(`no node ${name}`);
    return n;
  }

  startNode(name: string): void {
    const n = this.node(name);
    n.proc = Bun.spawn([natsServer(), "-c", n.conf], { stdout: "ignore", stderr: "ignore" });
    this.onSpawn?.(n.proc);
  }

  /** Called with every node process started (a harness that kills what it started on exit). */
  onSpawn: ((p: ReturnType<typeof Bun.spawn>) => void) | undefined;

  /** Stops one node (SIGKILL by default) and waits for the process to end. */
  async stopNode(name: string, signal: "SIGKILL" | "SIGTERM" = "SIGKILL"): Promise<void> {
    const n = this.node(name);
    if (!n.proc) return;
    n.proc.kill(signal);
    await n.proc.exited;
    n.proc = null;
  }

  /** Waits until the running nodes' JetStream answers account requests. */
  async waitReady(timeoutMs = 30_000): Promise<void> {
    const running = this.nodes.filter((n) => n.proc);
    await waitFor(
      async () => {
        let nc: NatsConnection | undefined;
        try {
          nc = await connect({ servers: running.map((n) => `127.0.0.1:${n.port}`), timeout: 1000, reconnect: false });
          const jsm = await nc.jetstreamManager({ timeout: 1000 });
          await jsm.getAccountInfo();
          return true;
        } catch {
          return false;
        } finally {
          await nc?.close().catch(() => {});
        }
      },
      "jetstream cluster ready",
      timeoutMs,
      200,
    );
  }

  /** A client connection to the whole cluster. */
  client(): Promise<NatsConnection> {
    return connect({ servers: this.servers.map((s) => s.replace("nats://", "")), maxReconnectAttempts: -1, reconnectTimeWait: 200 });
  }

  async stop(): Promise<void> {
    for (const n of this.nodes) await this.stopNode(n.name, "SIGKILL");
  }
}
