import { describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { tmpDir, waitFor } from "../helpers.ts";
import { cli, runAgent } from "./agent-process.ts";

const status = async (socket: string) => (await (await fetch("http://k/v1/status", { unix: socket } as RequestInit)).json()) as any;

describe("keyop run with tls", () => {
  test("name from the certificate CN, expiry warning, status, SIGHUP reload and a broken reload", async () => {
    const d = tmpDir();
    expect((await cli(["cert", "ca", "--out-dir", d])).code).toBe(0);
    expect((await cli(["cert", "issue", "--name", "board-9", "--ca-dir", d, "--out-dir", d, "--days", "20"])).code).toBe(0);
    const cfg = join(d, "k.yaml");
    writeFileSync(cfg, `tls:\n  cert: ${d}/board-9.crt\n  key: ${d}/board-9.key\n  ca: ${d}/ca.crt\n`);
    const agent = await runAgent(d, ["--config", cfg]);
    try {
      expect(agent.logs()).toMatch(/"msg":"certificate expiry","warning":"certificate CN=board-9 expires in 19 days"/);
      let st = await status(agent.socket);
      expect(st.name).toBe("board-9");
      expect(st.tls).toMatchObject({ name: "board-9", cert_days_left: 19, ca: "CN=keyop-ca", ca_days_left: 3649 });
      expect((await cli(["status", "--socket", agent.socket])).out).toMatch(/^tls: +board-9, certificate expires \S+ \(19 days\), CA CN=keyop-ca/m);

      expect((await cli(["cert", "issue", "--name", "board-9", "--ca-dir", d, "--out-dir", d, "--days", "400", "--force"])).code).toBe(0);
      agent.child.proc.kill("SIGHUP");
      await waitFor(async () => (await status(agent.socket)).tls.cert_days_left === 399, "reloaded certificate in status");
      expect(agent.logs()).toContain('"msg":"tls material reloaded"');

      writeFileSync(join(d, "board-9.key"), "-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n");
      agent.child.proc.kill("SIGHUP");
      await waitFor(() => agent.logs().includes("tls reload failed, keeping the current certificate"), "failed reload logged");
      st = await status(agent.socket);
      expect(st.tls.cert_days_left).toBe(399);
      expect((await fetch("http://k/healthz", { unix: agent.socket } as RequestInit)).ok).toBe(true);
    } finally {
      agent.child.proc.kill("SIGTERM");
      await agent.child.proc.exited;
    }
  }, 60_000);

  test("refused at start: NODE_TLS_REJECT_UNAUTHORIZED=0 with federation, mismatched files", async () => {
    const d = tmpDir();
    await cli(["cert", "ca", "--out-dir", d]);
    await cli(["cert", "issue", "--name", "hub", "--ca-dir", d, "--out-dir", d]);
    await cli(["cert", "issue", "--name", "other", "--ca-dir", d, "--out-dir", d]);
    const fed = join(d, "fed.yaml");
    writeFileSync(fed, `storage:\n  data_dir: ${d}/data\ntls:\n  cert: ${d}/hub.crt\n  key: ${d}/hub.key\n  ca: ${d}/ca.crt\nhub:\n  listen: 127.0.0.1:0\n`);
    const r = await cli(["run", "--config", fed], { env: { NODE_TLS_REJECT_UNAUTHORIZED: "0" } });
    expect(r.code).toBe(2);
    expect(r.err).toContain("NODE_TLS_REJECT_UNAUTHORIZED=0 is set");
    const bad = join(d, "bad.yaml");
    writeFileSync(bad, `storage:\n  data_dir: ${d}/data2\ntls:\n  cert: ${d}/hub.crt\n  key: ${d}/other.key\n  ca: ${d}/ca.crt\n`);
    const m = await cli(["run", "--config", bad]);
    expect(m.code).toBe(2);
    expect(m.err).toContain(`tls.key: ${d}/other.key is not the private key of ${d}/hub.crt`);
  }, 30_000);
});
