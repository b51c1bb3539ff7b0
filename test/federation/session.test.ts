import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { AuditLog } from "../../src/federation/audit.ts";
import { ackFrame, batchFrame, helloFrame, type Welcome } from "../../src/federation/messages.ts";
import { type PeerSession, sessionHandler, type SessionEvents } from "../../src/federation/session.ts";
import { createCa, issueCert, type CertAndKey } from "../../src/pki/certs.ts";
import { connectMtls, MtlsServer } from "../../src/pki/mtls.ts";
import { loadTlsMaterial, type TlsMaterial } from "../../src/pki/tls.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { tmpDir, waitFor } from "../helpers.ts";

let dir: string;
let ca: CertAndKey;
const mats: Record<string, TlsMaterial> = {};
const HB = 120;

async function material(name: string): Promise<TlsMaterial> {
  const c = await issueCert(ca, { name, ip: ["127.0.0.1"] });
  const files = { cert: join(dir, `${name}.crt`), key: join(dir, `${name}.key`), ca: join(dir, "ca.crt") };
  writeFileSync(files.cert, c.certPem);
  writeFileSync(files.key, c.keyPem);
  return loadTlsMaterial(files);
}

const PEERS = new Set(["dev1", "dev2", "silent"]);
let hub: MtlsServer<PeerSession>;
let audit: AuditLog;
const hubLog = { sessions: [] as PeerSession[], batches: [] as string[], closed: [] as string[], rejected: [] as string[] };

beforeAll(async () => {
  dir = tmpDir();
  ca = await createCa();
  writeFileSync(join(dir, "ca.crt"), ca.certPem);
  for (const n of ["hub", "dev1", "dev2", "dev3", "silent"]) mats[n] = await material(n);
  audit = new AuditLog({ path: join(dir, "audit.log"), maxFileBytes: 1 << 20, maxFiles: 2, logger: silentLogger });
  const events: SessionEvents = {
    onHello: (_s, h): Welcome => ({ version: 1, name: "hub", publish: h.publish, subscribe: h.subscribe, heartbeatMs: HB, maxBatchBytes: h.maxBatchBytes }),
    onBatch: (s, b) => {
      hubLog.batches.push(`${s.peer.name}:${b.channel}:${b.seqs.join(",")}`);
      s.send(ackFrame({ batch: b.batch, channel: b.channel, upto: b.seqs.at(-1)! }));
    },
    onClose: (s, reason) => void hubLog.closed.push(`${s.peer.name} ${reason}`),
  };
  hub = MtlsServer.listen<PeerSession>(
    {
      hostname: "127.0.0.1",
      port: 0,
      material: mats.hub!,
      logger: silentLogger,
      authorize: (p) => (PEERS.has(p.name) ? null : `unknown peer "${p.name}" (not in hub.peers)`),
      onReject: (reason) => {
        hubLog.rejected.push(reason);
        audit.record("peer_rejected", { reason });
      },
    },
    sessionHandler({ role: "hub", maxBody: 1 << 20, heartbeatMs: HB, logger: silentLogger, audit }, events, (s) => hubLog.sessions.push(s)),
  );
});
afterAll(() => hub.stop(true));

/** A client session to the hub; resolves once WELCOME arrived (or it closed). */
async function client(name: string, versions = [1]) {
  const log = { acks: [] as number[], closed: [] as string[], session: undefined as PeerSession | undefined, open: false };
  await connectMtls<PeerSession>(
    { hostname: "127.0.0.1", port: hub.port, material: mats[name]!, logger: silentLogger },
    sessionHandler(
      { role: "client", maxBody: 1 << 20, heartbeatMs: HB, logger: silentLogger },
      { onOpen: () => void (log.open = true), onAck: (_s, a) => void log.acks.push(a.upto), onClose: (_s, r) => void log.closed.push(r) },
      (s) => {
        log.session = s;
        s.sendHello({ versions, name, mode: "link", publish: ["t.>"], subscribe: [], heartbeatMs: HB, maxBatchBytes: 1 << 20 });
      },
    ),
  );
  await waitFor(() => log.open || log.closed.length > 0, `${name} handshake`);
  return log;
}

describe("federation session", () => {
  test("handshake, then a batch up and its ack down; the hub knows the peer by certificate", async () => {
    const c = await client("dev1");
    expect(c.open).toBe(true);
    expect(c.session!.welcome).toMatchObject({ version: 1, name: "hub", heartbeatMs: HB });
    c.session!.send(batchFrame({ batch: 1, channel: "t.a", seqs: [3, 4], records: [new Uint8Array([1]), new Uint8Array([2])] }));
    await waitFor(() => c.acks.length === 1, "ack");
    expect(c.acks).toEqual([4]);
    expect(hubLog.batches).toContain("dev1:t.a:3,4");
    expect(hubLog.sessions.some((s) => s.peer.name === "dev1" && s.state === "open")).toBe(true);
    c.session!.close("bye", "test done");
  });

  test("no common version: the hub closes with the reason", async () => {
    const c = await client("dev2", [9]);
    await waitFor(() => c.closed.length === 1, "close");
    expect(c.closed[0]).toContain("peer closed: version: no common protocol version");
  });

  test("a CN not in hub.peers is refused at the handshake and audited", async () => {
    const before = hubLog.rejected.length;
    let closed = false;
    await connectMtls({ hostname: "127.0.0.1", port: hub.port, material: mats.dev3!, logger: silentLogger }, { open: () => {}, data: () => {}, close: () => void (closed = true) }).catch(() => {});
    await waitFor(() => hubLog.rejected.length === before + 1, "rejection");
    expect(hubLog.rejected.at(-1)).toBe('unknown peer "dev3" (not in hub.peers)');
    await audit.flush();
    expect(readFileSync(join(dir, "audit.log"), "utf8")).toContain('"event":"peer_rejected","reason":"unknown peer \\"dev3\\" (not in hub.peers)"');
    expect(hubLog.sessions.some((s) => s.peer.name === "dev3")).toBe(false);
    await waitFor(() => closed, "dev3's connection closed by the hub");
  });

  test("garbage from a verified peer: that session is closed and audited, others carry on", async () => {
    const healthy = await client("dev1");
    const bad = await client("dev2");
    const closedBefore = hubLog.closed.length;
    // Raw bytes through the client's session: a frame header of protocol version 9.
    bad.session!.send(new Uint8Array([0x4b, 0x59, 9, 9, 0, 0, 0, 1, 0]));
    await waitFor(() => hubLog.closed.length > closedBefore, "hub closed the bad session");
    expect(hubLog.closed.at(-1)).toMatch(/^dev2 malformed_frame: malformed frame: unsupported protocol version 9/);
    await waitFor(() => bad.closed.length === 1, "bad client sees the close");
    healthy.session!.send(batchFrame({ batch: 7, channel: "t.b", seqs: [1], records: [new Uint8Array([1])] }));
    await waitFor(() => healthy.acks.includes(1), "healthy session still works");
    await audit.flush();
    expect(readFileSync(join(dir, "audit.log"), "utf8")).toMatch(/"event":"malformed_frame","peer":"dev2"/);
    healthy.session!.close("bye", "done");
  });

  test("a peer that goes silent (no FIN) is closed within three heartbeats; an idle healthy one is not", async () => {
    const healthy = await client("dev1");
    // "silent" sends HELLO and then neither reads nor writes anything, as a vanished host would.
    const t0 = Date.now();
    await connectMtls(
      { hostname: "127.0.0.1", port: hub.port, material: mats.silent!, logger: silentLogger },
      {
        open: (s) => void s.write(helloFrame({ versions: [1], name: "silent", mode: "link", publish: [], subscribe: [], heartbeatMs: HB, maxBatchBytes: 4096 })),
        data: () => {},
      },
    );
    await waitFor(() => hubLog.closed.some((c) => c.startsWith("silent heartbeat")), "heartbeat close", 5000);
    const took = Date.now() - t0;
    expect(took).toBeGreaterThanOrEqual(3 * HB);
    expect(took).toBeLessThan(3 * HB + HB / 4 + 1000);
    // Whichever side pings first is answered, which keeps the other from needing to ping.
    const hubSide = hubLog.sessions.find((s) => s.peer.name === "dev1" && s.state === "open");
    await waitFor(() => healthy.session!.rttMs !== undefined || hubSide?.rttMs !== undefined, "pings answered");
    expect(healthy.session!.state).toBe("open");
    expect(Date.now() - healthy.session!.connectedAt).toBeGreaterThan(3 * HB);
    healthy.session!.close("bye", "done");
  });
});
