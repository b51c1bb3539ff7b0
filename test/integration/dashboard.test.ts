/**
 * The dashboard in a real browser: headless Chromium (Debian's, installed by
 * test/system-deps.sh) driven by puppeteer-core against a real hub with
 * three linked boards. The page loads, the table lists the boards, a board
 * that is killed turns offline within seconds, the charts draw. Also the
 * access rules: logins, and client certificates from the keyop CA.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import puppeteer, { type Browser } from "puppeteer-core";
import { freePort, tmpDir, waitFor } from "../helpers.ts";
import { fleet, runAgent, type AgentProc } from "./agent-process.ts";

// The page's DOM, as code run in the browser by page.evaluate sees it (the project's types are Bun's, not a browser's).
declare const document: any;
type HTMLElement = any;
type HTMLInputElement = any;
type HTMLSelectElement = any;
declare const Event: any;

const CHROMIUM = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].find((p) => existsSync(p));
const DOCS = join(import.meta.dir, "..", "..", "docs");
let dir: string;
let hub: AgentProc;
const boards: AgentProc[] = [];
let browser: Browser | undefined;
const dashPort = freePort();
const hubPort = freePort();

beforeAll(async () => {
  dir = tmpDir();
  const tls = await fleet(dir, ["hub", "board-1", "board-2", "board-3"]);
  const fed = "federation:\n  heartbeat_ms: 300ms\n  reconnect_base_ms: 100ms\n  reconnect_max_ms: 300ms\n";
  const peers = [1, 2, 3, 4].map((i) => `    - {name: board-${i}, publish: ["t.>"], subscribe: ["cmd.>"]}\n`).join("");
  const hubCfg = join(dir, "hub.yaml");
  writeFileSync(hubCfg, tls("hub") + fed + `audit:\n  path: ${join(dir, "audit.log")}\ndashboard:\n  listen: 127.0.0.1:${dashPort}\nhub:\n  listen: 127.0.0.1:${hubPort}\n  peers:\n${peers}`);
  hub = await runAgent(join(dir, "hub"), ["--config", hubCfg]);
  for (const i of [1, 2, 3]) {
    const cfg = join(dir, `board-${i}.yaml`);
    writeFileSync(cfg, tls(`board-${i}`) + fed + `links:\n  - hub: 127.0.0.1:${hubPort}\n    publish: ["t.>"]\n    subscribe: ["cmd.>"]\n`);
    boards.push(await runAgent(join(dir, `board-${i}`), ["--config", cfg]));
  }
  // Some traffic for the charts and the channel table.
  for (const b of boards)
    await fetch("http://k/v1/channels/t.reading/messages", {
      method: "POST",
      body: Array.from({ length: 50 }, (_, i) => JSON.stringify({ type: "r", payload: i })).join("\n"),
      headers: { "content-type": "application/x-ndjson" },
      unix: b.socket,
    } as RequestInit);
  if (CHROMIUM) browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
}, 90_000);

afterAll(async () => {
  await browser?.close();
  for (const a of [...boards, hub]) a.child.proc.kill("SIGTERM");
  await Promise.all([...boards, hub].map((a) => a.child.proc.exited));
});

describe("dashboard in Chromium", () => {
  test("the page lists the boards, a killed board turns offline within seconds, the charts draw", async () => {
    if (!browser) throw new Error("chromium is not installed: apt-get install chromium (test/system-deps.sh installs it)");
    const page = await browser.newPage();
    await page.setViewport({ width: 1400, height: 1100 });
    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(`http://127.0.0.1:${dashPort}/`, { waitUntil: "domcontentloaded" });
    const state = (name: string) => page.evaluate((n) => document.querySelector(`#fleet tr[data-peer="${n}"]`)?.getAttribute("data-state") ?? null, name);
    await waitFor(async () => (await state("board-1")) === "open" && (await state("board-2")) === "open" && (await state("board-3")) === "open", "three boards open in the table", 20_000, 100);
    // board-4 is configured and never connected: listed, offline.
    expect(await state("board-4")).toBe("offline");
    expect(await page.evaluate(() => document.querySelector('#channels tr[data-channel="t.reading"]') !== null)).toBe(true);

    const t0 = performance.now();
    boards[1]!.child.proc.kill("SIGKILL");
    await waitFor(async () => (await state("board-2")) === "offline", "board-2 offline in the table", 10_000, 100);
    const seconds = (performance.now() - t0) / 1000;
    expect(seconds).toBeLessThan(8);
    expect(await state("board-1")).toBe("open");

    // The charts: four uPlot canvases, drawn with at least one point (the history samples every 10 s).
    await waitFor(
      async () => page.evaluate(() => [...document.querySelectorAll(".chart")].filter((c) => c.querySelector("canvas") && Number((c as HTMLElement).dataset.points ?? 0) >= 1).length === 4),
      "four charts with points",
      30_000,
      200,
    );
    // The audit list has the disconnect.
    await waitFor(async () => page.evaluate(() => document.querySelector("#audit")?.textContent?.includes("peer_disconnected") ?? false), "the disconnect in the audit list", 10_000, 100);
    // KEYOP_DOCS_SCREENSHOTS=1 writes the screenshot docs/dashboard.md shows; otherwise it goes to the test's directory.
    const shots = process.env.KEYOP_DOCS_SCREENSHOTS === "1" ? DOCS : dir;
    mkdirSync(shots, { recursive: true });
    await page.screenshot({ path: join(shots, "dashboard.png"), fullPage: true });
    expect(existsSync(join(shots, "dashboard.png"))).toBe(true);
    expect(errors).toEqual([]);
    await page.close();
  }, 90_000);

  test("filter and sort in the page: only matching rows, offline first when sorted by state", async () => {
    if (!browser) throw new Error("chromium is not installed");
    const page = await browser.newPage();
    await page.goto(`http://127.0.0.1:${dashPort}/`, { waitUntil: "domcontentloaded" });
    await waitFor(async () => page.evaluate(() => document.querySelectorAll("#fleet tbody tr").length >= 4), "rows", 20_000, 100);
    await page.type("#filter", "board-3");
    await waitFor(async () => page.evaluate(() => [...document.querySelectorAll("#fleet tbody tr")].map((r) => r.getAttribute("data-peer")).join(",") === "board-3"), "only board-3", 10_000, 100);
    await page.evaluate(() => {
      (document.getElementById("filter") as HTMLInputElement).value = "";
      const s = document.getElementById("state") as HTMLSelectElement;
      s.value = "offline";
      s.dispatchEvent(new Event("input"));
    });
    await waitFor(async () => page.evaluate(() => [...document.querySelectorAll("#fleet tbody tr")].every((r) => r.getAttribute("data-state") !== "open")), "only offline rows", 10_000, 100);
    await page.close();
  }, 60_000);
});

describe("dashboard access", () => {
  test("logins: 401 without or with a wrong password, the page with the right one; a non-loopback address without logins or tls does not start", async () => {
    const d = tmpDir();
    const port = freePort();
    const hash = await Bun.password.hash("s3cret", { algorithm: "argon2id" });
    const cfg = join(d, "k.yaml");
    writeFileSync(cfg, `dashboard:\n  listen: 127.0.0.1:${port}\n  users:\n    - {name: ops, password_hash: "${hash}"}\n`);
    const a = await runAgent(join(d, "a"), ["--config", cfg]);
    try {
      const url = `http://127.0.0.1:${port}/api/snapshot`;
      expect((await fetch(url)).status).toBe(401);
      expect((await fetch(url, { headers: { authorization: `Basic ${btoa("ops:wrong")}` } })).status).toBe(401);
      const ok = await fetch(url, { headers: { authorization: `Basic ${btoa("ops:s3cret")}` } });
      expect(ok.status).toBe(200);
      expect(((await ok.json()) as any).agent.role).toBe("agent");
    } finally {
      a.child.proc.kill("SIGTERM");
      await a.child.proc.exited;
    }
    const open = join(d, "open.yaml");
    writeFileSync(open, `dashboard:\n  listen: 0.0.0.0:${port}\n`);
    const r = Bun.spawnSync([process.execPath, join(import.meta.dir, "..", "..", "src", "main.ts"), "run", "--config", open, "--data-dir", join(d, "b")]);
    expect(r.exitCode).toBe(2);
    expect(r.stderr.toString()).toContain("dashboard.listen");
  }, 60_000);

  test("dashboard.tls: a client without a certificate from the keyop CA is refused; with one it gets the page", async () => {
    const d = tmpDir();
    const tls = await fleet(d, ["agent", "operator"]);
    const port = freePort();
    const cfg = join(d, "k.yaml");
    writeFileSync(cfg, tls("agent") + `dashboard:\n  listen: 127.0.0.1:${port}\n  tls: true\n`);
    const a = await runAgent(join(d, "a"), ["--config", cfg]);
    try {
      const ca = readFileSync(join(d, "pki", "ca.crt"), "utf8");
      const url = `https://127.0.0.1:${port}/api/snapshot`;
      const without = await fetch(url, { tls: { ca } } as RequestInit).then(
        (r) => r.status,
        () => "refused",
      );
      expect(without).toBe("refused");
      const withCert = await fetch(url, { tls: { ca, cert: readFileSync(join(d, "pki", "operator.crt"), "utf8"), key: readFileSync(join(d, "pki", "operator.key"), "utf8") } } as RequestInit);
      expect(withCert.status).toBe(200);
    } finally {
      a.child.proc.kill("SIGTERM");
      await a.child.proc.exited;
    }
  }, 60_000);
});
