/**
 * Where a two-hop message's time goes, read from the wire instead of from
 * hooks in the code: a trio (device A, hub, device B over mutual TLS, MQTT
 * on both devices) warmed up as the steady step warms up, then `secs` at
 * `rate` with loopback captured by tcpdump on its four connections. The
 * MQTT publishes carry their send time in clear; `wire.py` reads the TLS
 * links by their record sizes and splits each message's latency into the
 * client's send, A's turn, the hub's, B's and the harness's receipt. The
 * links run uncompressed, so that a batch's size tells how many records it
 * holds (compression only touches batches of 4 KiB and more, which come
 * after a stall, most often under `sync: always`).
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

/** CPU, run-queue wait (ns) and timeslices of every thread of `pid`, by thread id. */
function sched(pid: number): Map<string, number[]> {
  const s = new Map<string, number[]>();
  for (const t of readdirSync(`/proc/${pid}/task`)) {
    try {
      s.set(t, readFileSync(`/proc/${pid}/task/${t}/schedstat`, "utf8").trim().split(" ").map(Number));
    } catch {
      // The thread ended between the listing and the read.
    }
  }
  return s;
}

/** What the threads alive at both readings did between them (a thread that ended takes its counts with it). */
function schedBetween(before: Map<string, number[]>, after: Map<string, number[]>): { run: number; wait: number; slices: number } {
  const d = { run: 0, wait: 0, slices: 0 };
  for (const [t, [run = 0, wait = 0, slices = 0]] of after) {
    const [run0 = 0, wait0 = 0, slices0 = 0] = before.get(t) ?? [];
    d.run += run - run0;
    d.wait += wait - wait0;
    d.slices += slices - slices0;
  }
  return d;
}

const dir = mkdtempSync(join(tmpdir(), "keyop-wire-"));
const ports = { devA: freePort(), devB: freePort() };
const trio = await startTrio(dir, { pattern: "bench.>", sync: arg("sync", "none"), compression: "none", deviceYaml: (n) => `mqtt:\n  listen: 127.0.0.1:${ports[n]}\n` });
try {
  await until("mqtt listening", async () => (await portOpen(ports.devA)()) && portOpen(ports.devB)(), 20_000);
  const sub = await mqtt.connectAsync(`mqtt://127.0.0.1:${ports.devB}`, { clean: true });
  await sub.subscribeAsync("bench/pair", { qos: 1 });
  const pub = await mqtt.connectAsync(`mqtt://127.0.0.1:${ports.devA}`, { clean: true });
  const received: string[] = [];
  sub.on("message", (_t, p) => {
    received.push(`${JSON.parse(p.toString()).t} ${performance.timeOrigin + performance.now()}`);
  });
  let sent = 0;
  const send = () => (sent++, pub).publishAsync("bench/pair", JSON.stringify({ t: performance.timeOrigin + performance.now(), pad: PAD }), { qos: 1 });
  await pace(4000, 60_000, 64, send);
  await pace(rate, rate * 60, 64, send);
  // Nothing of the warm-up may still be on its way: the window's count of receipts and the
  // capture's records on the links must both be the window's messages and no others.
  await until("the warm-up delivered", async () => received.length >= sent, 10_000);
  const filter = `tcp port ${trio.port} or tcp port ${ports.devA} or tcp port ${ports.devB}`;
  const dump = Bun.spawn(["tcpdump", "-i", "lo", "-n", "-s", "65535", "-B", "16384", "-w", join(out, "wire.pcap"), filter], { stderr: "pipe" });
  // It says "listening on lo" once the capture runs.
  let said = "";
  const reader = dump.stderr.getReader();
  while (!said.includes("listening")) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`tcpdump did not start: ${said}`);
    said += new TextDecoder().decode(value);
  }
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
  // Its closing lines count the packets the kernel dropped: any drop shifts wire.py's matching.
  for (let r = await reader.read(); !r.done; r = await reader.read()) said += new TextDecoder().decode(r.value);
  for (const line of said.split("\n").filter((l) => /captured|dropped/.test(l))) console.log(`tcpdump: ${line.trim()}`);
  procs.forEach(([name], i) => {
    const d = schedBetween(before[i]!, after[i]!);
    console.log(`${name}: CPU ${(d.run / 1e3 / total).toFixed(1)} µs, runnable but waiting ${(d.wait / 1e3 / total).toFixed(1)} µs, timeslices ${(d.slices / total).toFixed(2)} per message`);
  });
  writeFileSync(join(out, "received.txt"), received.slice(from).join("\n"));
  writeFileSync(join(out, "ports.json"), JSON.stringify({ hub: trio.port, devA: ports.devA, devB: ports.devB }));
  await pub.endAsync();
  await sub.endAsync();
} finally {
  for (const p of [trio.devA, trio.devB, trio.hub]) await stop(p);
  rmSync(dir, { recursive: true, force: true });
}
