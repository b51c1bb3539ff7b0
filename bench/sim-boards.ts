/**
 * Simulated boards for the fleet step of the scale-out benchmark: each one a
 * real mutual-TLS federation session (keyop's own PeerSession, link mode)
 * with its own certificate, that sends records up in BATCH frames and
 * acknowledges what comes down, without a log of its own. A thousand of them
 * fit in one process, where a thousand agents would not fit on the machine.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { encodeEnvelope } from "../src/envelope/envelope.ts";
import { ackFrame, batchFrame, clientHello } from "../src/federation/messages.ts";
import { type PeerSession, sessionHandler } from "../src/federation/session.ts";
import { silentLogger } from "../src/observability/logger.ts";
import { createCa, issueCert } from "../src/pki/certs.ts";
import { connectMtls } from "../src/pki/mtls.ts";
import { loadTlsMaterial } from "../src/pki/tls.ts";

/** Certificates for a tier and `n` boards in `dir`: ca.crt, hub.crt/key, board-<i>.crt/key. */
export async function fleetCerts(dir: string, n: number): Promise<void> {
  const ca = await createCa();
  writeFileSync(join(dir, "ca.crt"), ca.certPem);
  for (const name of ["hub", ...Array.from({ length: n }, (_, i) => `board-${i}`)]) {
    const c = await issueCert(ca, { name, ip: ["127.0.0.1"] });
    writeFileSync(join(dir, `${name}.crt`), c.certPem);
    writeFileSync(join(dir, `${name}.key`), c.keyPem);
  }
}

/** One simulated board: its session to a hub, and what it sent and got. */
export class SimBoard {
  readonly name: string;
  session: PeerSession | null = null;
  /** Records acknowledged by the hub. */
  acked = 0;
  /** Records received from the hub. */
  received = 0;
  private nextBatch = 1;
  private nextSeq = 1;
  private readonly sizes = new Map<number, number>();

  private constructor(name: string) {
    this.name = name;
  }

  /** Connects board `name` (certificate in `dir`) to the hub at `port`; resolves when its session is open. */
  static async connect(dir: string, name: string, port: number, o: { publish: string[]; subscribe: string[] }): Promise<SimBoard> {
    const material = await loadTlsMaterial({ cert: join(dir, `${name}.crt`), key: join(dir, `${name}.key`), ca: join(dir, "ca.crt") });
    const b = new SimBoard(name);
    await new Promise<void>((resolve, reject) => {
      const handler = sessionHandler(
        { role: "client", maxBody: 2 << 20, heartbeatMs: 10_000, logger: silentLogger },
        {
          onOpen: (s) => {
            b.session = s;
            resolve();
          },
          onAck: (_s, a) => {
            b.acked += b.sizes.get(a.batch) ?? 0;
            b.sizes.delete(a.batch);
          },
          onBatch: (s, batch) => {
            b.received += batch.records.length;
            s.send(ackFrame({ batch: batch.batch, channel: batch.channel, upto: batch.seqs[batch.seqs.length - 1]! }));
          },
          onClose: (_s, reason) => reject(new Error(`${name}: ${reason}`)),
        },
        (s) => s.sendHello(clientHello({ name, mode: "link", publish: o.publish, subscribe: o.subscribe, heartbeatMs: 10_000, maxBatchBytes: 1 << 20, start: "latest" })),
      );
      connectMtls({ hostname: "127.0.0.1", port, material, logger: silentLogger, onReject: (r) => reject(new Error(r)) }, handler).catch(reject);
    });
    return b;
  }

  /** Sends `n` records on `channel` up in one BATCH. */
  send(channel: string, n: number, payload: unknown): void {
    const records = Array.from({ length: n }, () => encodeEnvelope({ id: Bun.randomUUIDv7(), ts: Date.now(), channel, origin: this.name, type: "n", route: [this.name], payload }));
    const batch = this.nextBatch++;
    this.sizes.set(batch, n);
    const seqs = records.map(() => this.nextSeq++);
    this.session!.send(batchFrame({ batch, channel, seqs, records }));
  }

  close(): void {
    this.session?.close("shutdown", "benchmark done");
  }
}
