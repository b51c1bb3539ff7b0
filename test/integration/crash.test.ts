import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { decodeEnvelope } from "../../src/envelope/envelope.ts";
import { createLogger } from "../../src/observability/logger.ts";
import { ChannelLog } from "../../src/store/channel-log.ts";
import { BUN, spawnLines, tmpDir, waitFor } from "../helpers.ts";

const fixture = join(import.meta.dir, "fixtures/crash-publisher.ts");

describe("crash safety", () => {
  test("SIGKILL at random moments loses no acknowledged publish and leaves no corrupt record", async () => {
    const dir = tmpDir();
    const acked = new Map<string, number>(); // id -> seq
    const rounds = 6;
    let recoveries = 0;
    for (let round = 0; round < rounds; round++) {
      const child = spawnLines([BUN, fixture, dir, "8", String(32 * 1024)]);
      const target = 100 + Math.floor(Math.random() * 1500);
      await waitFor(() => child.lines.length >= target, `${target} acks in round ${round}`, 30_000);
      // A random extra delay so the kill lands at different points of the write/fsync cycle.
      const spin = performance.now() + Math.random() * 20;
      while (performance.now() < spin);
      child.proc.kill("SIGKILL");
      await child.proc.exited;
      await child.done;
      for (const line of child.lines) {
        const [, seq, id] = line.split(" ");
        if (id) acked.set(id, Number(seq));
      }
      // Reopen the log directly and check every record.
      const lines: string[] = [];
      const log = await ChannelLog.open("crash.test", join(dir, "channels", "crash.test"), {
        segmentBytes: 32 * 1024,
        sync: "always",
        syncIntervalMs: 100,
        tailCacheBytes: 0,
        logger: createLogger({ write: (l) => lines.push(l) }),
      });
      if (lines.some((l) => l.includes("recovered torn tail"))) recoveries++;
      const stored = new Map<string, number>();
      let next = 1;
      while (true) {
        const recs = await log.read(next, 500);
        if (recs.length === 0) break;
        for (const r of recs) {
          expect(r.seq).toBe(next);
          const msg = decodeEnvelope(r.body, r.seq); // throws on a corrupt body
          expect(msg.channel).toBe("crash.test");
          stored.set(msg.id, r.seq);
          next++;
        }
      }
      expect(next).toBe(log.nextSeq);
      await log.close();
      for (const [id, seq] of acked) expect(stored.get(id)).toBe(seq);
    }
    expect(acked.size).toBeGreaterThan(rounds * 100);
    console.log(`crash test: ${rounds} kills, ${acked.size} acknowledged publishes all present, ${recoveries} torn tails cut`);
  }, 120_000);
});
