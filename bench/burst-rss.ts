/**
 * What an agent's memory does after a burst: one agent with an MQTT
 * listener takes `--n` QoS 1 publishes (64 in flight, 256 bytes, `sync:
 * none`), then sits idle while its RSS is read every 5 s. Shows how soon
 * the allocator gives memory back under the options in the environment
 * (each option set there is passed on to the agent, whose re-execution
 * keeps it):
 *
 *   bun bench/burst-rss.ts [--n=200000] [--idle=90]
 *   MIMALLOC_PURGE_HOLES_MIN_INTERVAL=100 bun bench/burst-rss.ts
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import mqtt from "mqtt";
import { start, stop } from "./fed-lib.ts";
import { portOpen, until } from "./procs.ts";
import { freePort } from "./servers.ts";

const arg = (name: string, dflt: number) => Number(process.argv.find((a) => a.startsWith(`--${name}=`))?.split("=")[1] ?? dflt);

/** VmRSS / RssAnon of `pid` in MB. */
function rss(pid: number): string {
  const s = readFileSync(`/proc/${pid}/status`, "utf8");
  const mb = (key: string) => Math.round(Number(new RegExp(`${key}:\\s+(\\d+)`).exec(s)?.[1] ?? 0) / 1024);
  return `${mb("VmRSS")}/${mb("RssAnon")}`;
}

async function main(): Promise<void> {
  const n = arg("n", 200_000);
  const idleSecs = arg("idle", 90);
  const dir = mkdtempSync(join(tmpdir(), "keyop-burst-rss-"));
  const port = freePort();
  const agent = await start(dir, "agent", `mqtt:\n  listen: 127.0.0.1:${port}\n`, "none");
  try {
    await until("mqtt listening", portOpen(port), 20_000);
    const pid = agent.proc.pid;
    const client = await mqtt.connectAsync(`mqtt://127.0.0.1:${port}`, { clientId: "burst-rss" });
    const payload = Buffer.alloc(256, 120);
    const seen = [`start ${rss(pid)}`];
    let sent = 0;
    const worker = async () => {
      while (sent++ < n) await client.publishAsync("bench/in", payload, { qos: 1 });
    };
    await Promise.all(Array.from({ length: 64 }, worker));
    seen.push(`after ${n} ${rss(pid)}`);
    await client.endAsync();
    for (let t = 5; t <= idleSecs; t += 5) {
      await Bun.sleep(5000);
      seen.push(`${t}s ${rss(pid)}`);
    }
    const opts = Object.entries(process.env)
      .filter(([k]) => k.startsWith("MIMALLOC_"))
      .map(([k, v]) => `${k}=${v}`)
      .join(" ");
    console.log(`RSS / RssAnon MB (${opts || "keyop's defaults"}): ${seen.join(", ")}`);
  } finally {
    await stop(agent);
    rmSync(dir, { recursive: true, force: true });
  }
}

if (import.meta.main) await main();
