/**
 * The monitoring files in deploy/ against real agents: every metric the
 * Grafana dashboard and the Prometheus alert rules use is one a hub or a
 * board exports, scraped over the API socket and over `api.metrics_listen`.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { freePort, tmpDir, waitFor } from "../helpers.ts";
import { fleet, runAgent, type AgentProc } from "./agent-process.ts";

const DEPLOY = join(import.meta.dir, "..", "..", "deploy");
let hub: AgentProc;
let board: AgentProc;
const metricsPort = freePort();

async function api(a: AgentProc, method: string, path: string, body?: string): Promise<any> {
  return (await fetch(`http://k${path}`, { method, body, headers: body ? { "content-type": "application/json" } : {}, unix: a.socket } as RequestInit)).json();
}

/** The metric family names in a Prometheus text exposition. */
function families(text: string): Set<string> {
  const out = new Set<string>();
  for (const line of text.split("\n")) {
    const m = /^# TYPE (\S+) /.exec(line);
    if (m) out.add(m[1]!);
  }
  return out;
}

/** keyop metric names an expression uses (a histogram's _bucket/_sum/_count as its family). */
function usedIn(expr: string): string[] {
  return [...expr.matchAll(/\bkeyop_[a-z0-9_]+/g)].map((m) => m[0].replace(/_(bucket|sum|count)$/, ""));
}

beforeAll(async () => {
  const dir = tmpDir();
  const tls = await fleet(dir, ["hub", "board"]);
  const hubPort = freePort();
  const hubCfg = join(dir, "hub.yaml");
  writeFileSync(hubCfg, tls("hub") + `hub:\n  listen: 127.0.0.1:${hubPort}\n  peers:\n    - {name: board, publish: ["t.>"], subscribe: ["cmd.>"]}\n`);
  hub = await runAgent(join(dir, "hub"), ["--config", hubCfg]);
  // Two links: one to the hub, one to a hub that is not there (its backlog grows old).
  const boardCfg = join(dir, "board.yaml");
  writeFileSync(
    boardCfg,
    tls("board") +
      `api:\n  metrics_listen: 127.0.0.1:${metricsPort}\n` +
      "federation:\n  heartbeat_ms: 200ms\n  reconnect_base_ms: 100ms\n  reconnect_max_ms: 500ms\n" +
      `links:\n  - hub: 127.0.0.1:${hubPort}\n    publish: ["t.>"]\n    subscribe: ["cmd.>"]\n  - hub: 127.0.0.1:${freePort()}\n    publish: ["t.>"]\n`,
  );
  board = await runAgent(join(dir, "board"), ["--config", boardCfg]);
  await api(board, "POST", "/v1/channels/t.reading/messages", JSON.stringify({ type: "r", payload: 1 }));
  await api(board, "GET", "/v1/channels/t.reading/messages?subscriber=local&from=earliest");
  await waitFor(async () => (await api(board, "GET", "/v1/status")).links.some((l: any) => l.state === "open" && l.rtt_ms !== null), "the board's link open with a round trip", 20_000);
}, 60_000);

afterAll(async () => {
  for (const a of [board, hub]) {
    a.child.proc.kill("SIGTERM");
    await a.child.proc.exited;
  }
});

describe("deploy/ monitoring files", () => {
  test("api.metrics_listen serves /metrics and /healthz over TCP, and nothing else", async () => {
    const r = await fetch(`http://127.0.0.1:${metricsPort}/metrics`);
    expect(r.status).toBe(200);
    expect(await r.text()).toContain("keyop_uptime_seconds");
    expect(await (await fetch(`http://127.0.0.1:${metricsPort}/healthz`)).text()).toBe("ok\n");
    expect((await fetch(`http://127.0.0.1:${metricsPort}/v1/status`)).status).toBe(404);
    expect((await fetch(`http://127.0.0.1:${metricsPort}/metrics`, { method: "POST" })).status).toBe(405);
  });

  test("every metric the dashboard and the alert rules use is exported by a hub or a board", async () => {
    const exported = new Set<string>();
    const boardText = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
    const hubText = await (await fetch("http://k/metrics", { unix: hub.socket } as RequestInit)).text();
    for (const f of [...families(boardText), ...families(hubText)]) exported.add(f);
    // The figures the alerts need: a certificate's expiry, the disk, an old backlog on the link that is down.
    expect(boardText).toMatch(/keyop_tls_cert_expiry_timestamp_seconds\{cert="own"\} \d{10}/);
    expect(boardText).toMatch(/keyop_disk_free_bytes \d+/);
    expect(boardText).toMatch(/keyop_federation_oldest_unacked_seconds\{.*priority="4"\} [\d.]+/);
    // The link that never connected shows its own backlog (its hold's), not the other link's.
    // (The connected link's count falls to 0 when the hub's acknowledgement arrives.)
    const backlogs = async () => (await api(board, "GET", "/v1/status")).links.map((l: any) => l.backlog.find((b: any) => b.channel === "t.reading")?.messages).sort();
    await waitFor(async () => (await backlogs()).join() === "0,1", "the connected link's backlog acknowledged", 10_000, 50);
    expect(await backlogs()).toEqual([0, 1]);

    const dashboard = JSON.parse(readFileSync(join(DEPLOY, "grafana", "keyop.json"), "utf8"));
    const dashExprs: string[] = dashboard.panels.flatMap((p: any) => p.targets.map((t: any) => t.expr));
    expect(dashExprs.length).toBeGreaterThan(10);
    for (const p of dashboard.panels) {
      expect(p.title).toBeTruthy();
      // biome-ignore lint/suspicious/noTemplateCurlyInString: Grafana's datasource variable, as the file spells it
      expect(p.datasource.uid).toBe("${DS}");
    }
    const rules = (Bun.YAML.parse(readFileSync(join(DEPLOY, "prometheus", "keyop-alerts.yml"), "utf8")) as any).groups.flatMap((g: any) => g.rules);
    const names = rules.map((r: any) => r.alert);
    for (const want of ["KeyopLinkDown", "KeyopBacklogOld", "KeyopCertificateExpiring", "KeyopDiskFilling"]) expect(names).toContain(want);
    for (const r of rules) {
      expect(typeof r.expr).toBe("string");
      expect(r.labels.severity).toBeTruthy();
      expect(r.annotations.summary).toBeTruthy();
    }
    const used = new Set([...dashExprs, ...rules.map((r: any) => r.expr)].flatMap(usedIn));
    expect(used.size).toBeGreaterThan(15);
    const missing = [...used].filter((n) => !exported.has(n));
    expect(missing).toEqual([]);
  });
});
