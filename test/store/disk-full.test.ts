import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import mqttPacket from "mqtt-packet";
import { MqttSession } from "../../src/mqtt/session.ts";
import { startTestAgent, waitFor } from "../helpers.ts";
import { join } from "node:path";
import { Messenger } from "../../src/index.ts";
import { DiskFullError } from "../../src/errors.ts";
import { createLogger } from "../../src/observability/logger.ts";

/** Mounts a 2 MiB tmpfs, or returns why it cannot. */
function mountTmpfs(dir: string): string | null {
  const r = Bun.spawnSync(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", dir], { stderr: "pipe" });
  return r.exitCode === 0 ? null : `mount failed: ${r.stderr.toString().trim() || `exit ${r.exitCode}`}`;
}

/** An MQTT 5 session of the agent's listener, wired to a parser that collects its PUBACKs, after its CONNACK. */
async function mqtt5Session(a: Awaited<ReturnType<typeof startTestAgent>>, clientId: string): Promise<{ s: MqttSession; acks: { id: number; reason: number }[] }> {
  const acks: { id: number; reason: number }[] = [];
  const parser = mqttPacket.parser({ protocolVersion: 5 });
  let connacked = false;
  parser.on("packet", (p) => {
    if (p.cmd === "connack") connacked = true;
    if (p.cmd === "puback") acks.push({ id: p.messageId!, reason: (p as { reasonCode?: number }).reasonCode ?? 0 });
  });
  const write = (b: Uint8Array) => (parser.parse(Buffer.from(b)), true);
  const wire = { write, writeNow: write, writeCopy: (b: Uint8Array) => write(b.slice()), writable: () => Promise.resolve(), behind: () => false, end() {} };
  const s = new MqttSession(a.agent.mqtt!, wire);
  s.data(mqttPacket.generate({ cmd: "connect", protocolId: "MQTT", protocolVersion: 5, clean: true, clientId, keepalive: 0 } as mqttPacket.Packet, { protocolVersion: 5 }));
  await waitFor(() => connacked, "CONNACK");
  return { s, acks };
}

// Not a tmpDir(): the mount must be gone before the directory is removed.
const mnt = mkdtempSync(join(tmpdir(), "keyop-tmpfs-"));
const skipReason = process.platform !== "linux" ? "not Linux" : mountTmpfs(mnt);
if (skipReason) console.log(`SKIP disk-full test: cannot mount tmpfs (${skipReason})`);
afterAll(() => {
  if (!skipReason) Bun.spawnSync(["umount", mnt]);
  rmSync(mnt, { recursive: true, force: true });
});

describe.skipIf(skipReason !== null)("disk full", () => {
  test("publish fails with disk_full, nothing partial is stored, publishing resumes after space is freed", async () => {
    const dataDir = join(mnt, "data");
    mkdirSync(dataDir);
    const logLines: string[] = [];
    const logger = createLogger({ level: "debug", write: (l) => logLines.push(l) });
    let m = await Messenger.open({ name: "df", storage: { dataDir, segmentBytes: 256 * 1024 }, logger });
    const filler = join(mnt, "filler");
    writeFileSync(filler, new Uint8Array(1024 * 1024));
    const acked: number[] = [];
    let err: unknown;
    const payload = "z".repeat(8000);
    for (let i = 0; i < 1000 && !err; i++) {
      try {
        acked.push((await m.publish("fill", "t", { i, payload })).seq);
      } catch (e) {
        err = e;
      }
    }
    expect(err).toBeInstanceOf(DiskFullError);
    expect((err as DiskFullError).code).toBe("disk_full");
    expect(acked.length).toBeGreaterThan(10);
    // Still full: a second try fails the same way, and reads keep working.
    await expect(m.publish("fill", "t", { payload })).rejects.toMatchObject({ code: "disk_full" });
    const seen: number[] = [];
    const sub = await m.subscribe("fill", "reader", (msg) => void seen.push(msg.seq), { from: "earliest" });
    const deadline = Date.now() + 10_000;
    while (seen.length < acked.length && Date.now() < deadline) await Bun.sleep(5);
    expect(seen).toEqual(acked);
    await m.unsubscribe(sub);
    // Free space: publishing works again, with the next seq (no hole, nothing partial).
    rmSync(filler);
    const next = await m.publish("fill", "t", { after: true });
    expect(next.seq).toBe(acked.length + 1);
    await m.close();
    logLines.length = 0;
    m = await Messenger.open({ name: "df", storage: { dataDir, segmentBytes: 256 * 1024 }, logger });
    expect(logLines.some((l) => l.includes("recovered torn tail"))).toBe(false);
    await m.close();
    // Starting on a full disk works too: reads are served, publishes fail with disk_full.
    writeFileSync(join(mnt, "filler2"), new Uint8Array(4 * 1024 * 1024).subarray(0, 0));
    let big: Uint8Array | null = new Uint8Array(64 * 1024);
    try {
      for (let i = 0; ; i++) writeFileSync(join(mnt, `fill-${i}`), big);
    } catch {
      big = null;
    }
    m = await Messenger.open({ name: "df", storage: { dataDir, segmentBytes: 256 * 1024 }, logger });
    await expect(m.publish("fill", "t", { payload })).rejects.toMatchObject({ code: "disk_full" });
    expect(m.stats().channels.find((c) => c.channel === "fill")!.nextSeq).toBe(acked.length + 2);
    for (const f of (await import("node:fs")).readdirSync(mnt)) if (f.startsWith("fill")) rmSync(join(mnt, f));
    expect(m.stats().channels.find((c) => c.channel === "fill")!.nextSeq).toBe(acked.length + 2);
    await m.close();
  });

  test("over MQTT 5, publishes alone in their reads: PUBACK 0x97 once the disk is full, nothing partial stored, success again after space is freed", async () => {
    rmSync(join(mnt, "data"), { recursive: true, force: true }); // the first test's log
    const dir = join(mnt, "mqtt");
    mkdirSync(dir);
    const filler = join(mnt, "filler-mqtt");
    writeFileSync(filler, new Uint8Array(1024 * 1024));
    const a = await startTestAgent({ storage: { segment_bytes: "256KiB" }, mqtt: { listen: "127.0.0.1:0" } }, undefined, dir);
    try {
      const { s, acks } = await mqtt5Session(a, "full");
      const payload = Buffer.alloc(8000, 0x7a);
      let ok = 0;
      for (let id = 1; id <= 1000; id++) {
        s.data(mqttPacket.generate({ cmd: "publish", topic: "full", payload, qos: 1, messageId: id, retain: false, dup: false } as mqttPacket.Packet, { protocolVersion: 5 }));
        await waitFor(() => acks.length === id, `PUBACK ${id}`);
        // Each publish alone, in a turn of its own: the case that is written at once.
        await new Promise((r) => setImmediate(r));
        if (acks[id - 1]!.reason !== 0) break;
        ok++;
      }
      expect(acks.at(-1)).toEqual({ id: ok + 1, reason: 0x97 });
      expect(ok).toBeGreaterThan(10);
      const pulled = (await (await a.call("GET", "/v1/channels/full/messages?subscriber=r&from=earliest&max=10000")).json()) as any;
      expect(pulled.messages.length).toBe(ok);
      rmSync(filler);
      s.data(mqttPacket.generate({ cmd: "publish", topic: "full", payload: Buffer.from("after"), qos: 1, messageId: 2000, retain: false, dup: false } as mqttPacket.Packet, { protocolVersion: 5 }));
      await waitFor(() => acks.at(-1)!.id === 2000, "PUBACK 2000");
      expect(acks.at(-1)).toEqual({ id: 2000, reason: 0 });
      const all = (await (await a.call("GET", "/v1/channels/full/messages?subscriber=r2&from=earliest&max=10000")).json()) as any;
      expect(all.messages.length).toBe(ok + 1);
      expect(all.messages.at(-1).seq).toBe(ok + 1);
      s.socketClosed();
    } finally {
      await a.stop();
      rmSync(dir, { recursive: true, force: true }); // room for the next test
    }
  });

  test("over MQTT 5, windows of publishes in one read: PUBACKs in order, 0x97 from the first one refused on, nothing partial stored, success again after space is freed", async () => {
    rmSync(join(mnt, "data"), { recursive: true, force: true });
    const dir = join(mnt, "mqtt-window");
    mkdirSync(dir);
    const filler = join(mnt, "filler-mqtt-window");
    writeFileSync(filler, new Uint8Array(1024 * 1024));
    const a = await startTestAgent({ storage: { segment_bytes: "256KiB" }, mqtt: { listen: "127.0.0.1:0" } }, undefined, dir);
    try {
      const { s, acks } = await mqtt5Session(a, "full-window");
      const publish = (id: number, payload: Buffer) =>
        mqttPacket.generate({ cmd: "publish", topic: "fullw", payload, qos: 1, messageId: id, retain: false, dup: false } as mqttPacket.Packet, { protocolVersion: 5 });
      const payload = Buffer.alloc(8000, 0x7a);
      const WINDOW = 8;
      let id = 0;
      while (id < 1000 && acks.every((x) => x.reason === 0)) {
        // A client's window: several publishes in one read, stored together and acknowledged in order.
        const window = Array.from({ length: WINDOW }, () => publish(++id, payload));
        s.data(Buffer.concat(window));
        await waitFor(() => acks.length === id, `PUBACKs up to ${id}`);
      }
      expect(acks.map((x) => x.id)).toEqual(Array.from({ length: id }, (_, i) => i + 1));
      const ok = acks.findIndex((x) => x.reason !== 0);
      expect(ok).toBeGreaterThan(10);
      // From the first refused on, every one of the window is refused: nothing stored after a gap.
      expect(acks.slice(ok).every((x) => x.reason === 0x97)).toBe(true);
      const pulled = (await (await a.call("GET", "/v1/channels/fullw/messages?subscriber=r&from=earliest&max=10000")).json()) as any;
      expect(pulled.messages.length).toBe(ok);
      rmSync(filler);
      const after = Array.from({ length: WINDOW }, (_, i) => publish(2000 + i, Buffer.from(`after ${i}`)));
      s.data(Buffer.concat(after));
      await waitFor(() => acks.length === id + WINDOW, "the window after space was freed");
      expect(acks.slice(id)).toEqual(Array.from({ length: WINDOW }, (_, i) => ({ id: 2000 + i, reason: 0 })));
      const all = (await (await a.call("GET", "/v1/channels/fullw/messages?subscriber=r2&from=earliest&max=10000")).json()) as any;
      expect(all.messages.length).toBe(ok + WINDOW);
      expect(all.messages.map((m: { seq: number }) => m.seq)).toEqual(Array.from({ length: ok + WINDOW }, (_, i) => i + 1));
      s.socketClosed();
    } finally {
      await a.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("over HTTP: 507 disk_full, reads keep working, 201 again after space is freed", async () => {
    rmSync(join(mnt, "data"), { recursive: true, force: true }); // the first test's log
    const dir = join(mnt, "http");
    mkdirSync(dir);
    const filler = join(mnt, "filler-http");
    writeFileSync(filler, new Uint8Array(1024 * 1024));
    const a = await startTestAgent({ storage: { segment_bytes: "256KiB" } }, undefined, dir);
    try {
      const body = JSON.stringify({ type: "t", payload: "z".repeat(8000) });
      let last: Response | undefined;
      let ok = 0;
      for (let i = 0; i < 1000; i++) {
        last = await a.call("POST", "/v1/channels/full/messages", body);
        if (last.status !== 201) break;
        ok++;
      }
      expect(last!.status).toBe(507);
      expect(((await last!.json()) as any).error.code).toBe("disk_full");
      const pulled = (await (await a.call("GET", "/v1/channels/full/messages?subscriber=r&from=earliest&max=10000")).json()) as any;
      expect(pulled.messages.length).toBe(ok);
      rmSync(filler);
      const after = await a.call("POST", "/v1/channels/full/messages", JSON.stringify({ type: "t", payload: "after" }));
      expect(after.status).toBe(201);
      expect(((await after.json()) as any).seq).toBe(ok + 1);
    } finally {
      await a.stop();
    }
  });
});
