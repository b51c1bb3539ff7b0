/**
 * Where a two-hop message's time goes, read from the wire instead of from
 * hooks in the code: a trio (device A, hub, device B over mutual TLS, MQTT
 * on both devices) warmed up as the steady step warms up, then `secs` at
 * `rate` with loopback captured by tcpdump on its four connections. The
 * MQTT publishes carry their send time in clear; `wire.py` reads the TLS
 * links by their record sizes and splits each message's latency into the
 * client's send, A's turn, the hub's, B's and the harness's receipt.
 * Also prints, per process, CPU and the time runnable but not running
 * (`/proc/PID/task/TID/schedstat`) per message over the window.
 *
 *   bun bench/hop-trace/wire.ts [--rate=1000] [--secs=20] [--out=/tmp/keyop-wire]
 *   python3 bench/hop-trace/wire.py /tmp/keyop-wire
 *
 * Needs tcpdump (Debian's package) and root.
 */
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import mqtt from "mqtt";
import { startTrio, stop } from "../fed-lib.ts";
import { arg, pace } from "../lib.ts";
import { portOpen, until } from "../procs.ts";
import { freePort } from "../servers.ts";

const rate = Number(arg("rate", "1000"));
const secs = Number(arg("secs", "20"));
const out = arg("out", "/tmp/keyop-wire");
mkdirSync(out, { recursive: true });
const PAD = "x".repeat(200);

/** CPU, run-queue wait (ns) and timeslices of every thread of `pid`. */
function sched(pid: number): { run: number; wait: number; slices: number } {
  const s = { run: 0, wait: 0, slices: 0 };
  for (const t of readdirSync(`/proc/${pid}/task`)) {
    try {
      const [run = 0, wait = 0, slices = 0] = readFileSync(`/proc/${pid}/task/${t}/schedstat`, "utf8").trim().split(" ").map(Number);
      s.run += run;
      s.wait += wait;
      s.slices += slices;
    } catch {
      // The thread ended between the listing and the read.
    }
  }
  return s;
}

const dir = mkdtempSync(join(tmpdir(), "keyop-wire-"));
const ports = { devA: freePort(), devB: freePort() };
const trio = await startTrio(dir, { pattern: "bench.>", sync: arg("sync", "none"), deviceYaml: (n) => `mqtt:\n  listen: 127.0.0.1:${ports[n]}\n` });
try {
  await until("mqtt listening", async () => (await portOpen(ports.devA)()) && portOpen(ports.devB)(), 20_000);
  const sub = await mqtt.connectAsync(`mqtt://127.0.0.1:${ports.devB}`, { clean: true });
  await sub.subscribeAsync("bench/pair", { qos: 1 });
  const pub = await mqtt.connectAsync(`mqtt://127.0.0.1:${ports.devA}`, { clean: true });
  const received: string[] = [];
  sub.on("message", (_t, p) => {
    received.push(`${JSON.parse(p.toString()).t} ${performance.timeOrigin + performance.now()}`);
  });
  const send = () => pub.publishAsync("bench/pair", JSON.stringify({ t: performance.timeOrigin + performance.now(), pad: PAD }), { qos: 1 });
  await pace(4000, 60_000, 64, send);
  await pace(rate, rate * 60, 64, send);
  const filter = `tcp port ${trio.port} or tcp port ${ports.devA} or tcp port ${ports.devB}`;
  const dump = Bun.spawn(["tcpdump", "-i", "lo", "-n", "-s", "1500", "-B", "16384", "-w", join(out, "wire.pcap"), filter], { stderr: "pipe" });
  // It says "listening on lo" once the capture runs.
  let said = "";
  const reader = dump.stderr.getReader();
  while (!said.includes("listening")) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`tcpdump did not start: ${said}`);
    said += new TextDecoder().decode(value);
  }
  reader.releaseLock();
  const procs = [
    ["A", trio.devA.proc.pid],
    ["hub", trio.hub.proc.pid],
    ["B", trio.devB.proc.pid],
    ["harness", process.pid],
  ] as const;
  const before = procs.map(([, pid]) => sched(pid));
  const from = received.length;
  const total = rate * secs;
  await pace(rate, total, 64, send);
  await until("all delivered", async () => received.length - from >= total, 10_000);
  const after = procs.map(([, pid]) => sched(pid));
  dump.kill("SIGINT");
  await dump.exited;
  procs.forEach(([name], i) => {
    const b = before[i]!;
    const a = after[i]!;
    console.log(
      `${name}: CPU ${((a.run - b.run) / 1e3 / total).toFixed(1)} µs, runnable but waiting ${((a.wait - b.wait) / 1e3 / total).toFixed(1)} µs, timeslices ${((a.slices - b.slices) / total).toFixed(2)} per message`,
    );
  });
  writeFileSync(join(out, "received.txt"), received.slice(from).join("\n"));
  writeFileSync(join(out, "ports.json"), JSON.stringify({ hub: trio.port, devA: ports.devA, devB: ports.devB }));
  await pub.endAsync();
  await sub.endAsync();
} finally {
  for (const p of [trio.devA, trio.devB, trio.hub]) await stop(p);
  rmSync(dir, { recursive: true, force: true });
}
