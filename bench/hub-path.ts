/**
 * The hub's path of one message inside one process, without sockets or
 * other processes: a BATCH frame from device A goes into a hub-side
 * `PeerSession`, the `Receiver` stores it in a real log (`sync: none`), the
 * `Forwarder` of device B's cursor reads it and writes a BATCH into B's
 * session, whose transport hands the bytes back here; B's ACK comes back
 * after B's own hold, as a real B would send it.
 *
 * It measures what keyop's code costs per message on the hub apart from
 * the kernel and the TLS sockets: CPU (process.cpuUsage, all threads) per
 * message, one message at a time (what a board's rate looks like to the
 * hub: every message alone) and paced at a fixed rate. For A/B of a change
 * to the path, with far less noise than the three-process step.
 *
 *   bun bench/hub-path.ts [--n=20000] [--warm=60000] [--segments=5] [--rate=1000] [--sync=none|always] [--cells=300]
 *
 * It prints one JSON line, of the median of the measured segments: CPU and wall time per message, minor page
 * faults and voluntary context switches per message, RSS, and the CPU of
 * each kind of thread.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { RecentIds } from "../src/federation/dedup.ts";
import { Forwarder } from "../src/federation/forwarder.ts";
import { FrameDecoder, FrameType } from "../src/federation/frame.ts";
import { ackFrame, clientHello, helloFrame, parseBatch } from "../src/federation/messages.ts";
import { Receiver } from "../src/federation/receiver.ts";
import { PeerSession, type SessionTransport } from "../src/federation/session.ts";
import { messengerSink } from "../src/federation/sink.ts";
import { Messenger } from "../src/messenger/messenger.ts";
import { silentLogger } from "../src/observability/logger.ts";
import { tuneRuntime } from "../src/cli/runtime-options.ts";
import { Arrivals, cellsPerInput, measure, oneRecordBatches, pathOptions, report } from "./self-stats.ts";

// With the allocator and the JIT as `keyop run` sets them (this re-executes the script once).
tuneRuntime();

const opts = pathOptions();
const { n: N, rate: RATE, sync: SYNC } = opts;
const B_ACK_HOLD_MS = 5;

const dir = mkdtempSync(join(tmpdir(), "keyop-hub-path-"));
const messenger = await Messenger.open({ name: "hub", storage: { dataDir: dir, sync: SYNC }, logger: silentLogger });
const identity = (name: string) => ({ name, fingerprint: `fp-${name}`, notAfter: new Date(Date.now() + 86_400_000) });
const sessionOpts = { maxBody: (1 << 20) + 65_536, heartbeatMs: 5_000, logger: silentLogger };
const welcome = (subscribe: string[]) => ({ version: 1, name: "hub", publish: ["up.>"], subscribe, heartbeatMs: 5_000, maxBatchBytes: 1 << 20 });

/** A transport that takes every byte; what it is given goes to `onBytes`. */
function transport(onBytes: (b: Uint8Array) => void): SessionTransport {
  return {
    write(bytes) {
      onBytes(bytes);
      return bytes.length;
    },
    end() {},
    terminate() {},
  };
}

// Device A's session at the hub: what A sends is fed to `fromA.receive`; the hub's ACKs to A are dropped.
let receiver: Receiver | null = null;
const fromA = new PeerSession(
  transport(() => {}),
  identity("a"),
  { ...sessionOpts, role: "hub" },
  {
    onHello: () => welcome([]),
    onBatch: (s, b) => receiver!.handle(s, b),
  },
);
receiver = new Receiver({ sink: messengerSink(messenger), self: "hub", dedup: new RecentIds(100_000), logger: silentLogger, allow: () => true });

// Device B's session at the hub: its transport decodes the hub's BATCHes and answers as B does (held ACKs).
const delivered = new Arrivals();
let forwarder = null as Forwarder | null;
const toBDecoder = new FrameDecoder(1 << 24);
const heldAcks: Uint8Array[] = [];
let ackPending = false;
const toB: PeerSession = new PeerSession(
  transport((bytes) => {
    let n = 0;
    for (const f of toBDecoder.push(bytes)) {
      if (f.type !== FrameType.BATCH) continue;
      const b = parseBatch(f);
      n += b.records.length;
      heldAcks.push(ackFrame({ batch: b.batch, channel: b.channel, upto: b.seqs[b.seqs.length - 1]! }));
      if (!ackPending) {
        ackPending = true;
        setTimeout(() => {
          ackPending = false;
          for (const a of heldAcks.splice(0)) toB.receive(a);
        }, B_ACK_HOLD_MS);
      }
    }
    delivered.add(n);
  }),
  identity("b"),
  { ...sessionOpts, role: "hub" },
  {
    onHello: () => welcome(["up.>"]),
    onOpen: (s) => {
      forwarder = new Forwarder({ messenger, session: s, patterns: ["up.>"], start: "latest", window: 64, maxBatchBytes: 1 << 20, logger: silentLogger });
      void forwarder.run();
    },
    onAck: (_s, a) => forwarder!.onAck(a),
  },
);
fromA.receive(helloFrame(clientHello({ name: "a", mode: "link", publish: ["up.>"], subscribe: [], heartbeatMs: 5_000, maxBatchBytes: 1 << 20 })));
toB.receive(helloFrame(clientHello({ name: "b", mode: "link", publish: [], subscribe: ["up.>"], heartbeatMs: 5_000, maxBatchBytes: 1 << 20 })));
while (!forwarder) await Bun.sleep(1);
await Bun.sleep(20);

// A's BATCH frames, one record each, as A's forwarder writes them.
const nextFrame = oneRecordBatches("up.t");

const feed = (f: Uint8Array) => fromA.receive(f);
const workload = RATE > 0 ? `hub path @${RATE}/s` : "hub path, one at a time";
console.log(opts.cells > 0 ? await cellsPerInput("hub path", nextFrame, feed, delivered, opts.warm, opts.cells) : report(workload, SYNC, N, await measure(nextFrame, feed, delivered, opts)));
forwarder?.stop();
await messenger.close();
rmSync(dir, { recursive: true, force: true });
process.exit(0);
