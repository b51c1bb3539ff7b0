/**
 * Fault scenario 6: certificates that must not get in, presented to a real
 * hub process by raw TLS clients. Each is refused before any of its frames
 * is read (by OpenSSL in the handshake, or by keyop's own checks right
 * after it, with a CLOSE frame saying why) and audited with the reason;
 * the hub keeps serving.
 * And the agent will not start federation with certificate checks turned
 * off in its environment.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { createCa, issueCert, type CertAndKey } from "../../src/pki/certs.ts";
import { FrameDecoder } from "../../src/federation/frame.ts";
import { helloFrame, parseClose } from "../../src/federation/messages.ts";
import { BUN, freePort, MAIN, tmpDir, waitFor } from "../helpers.ts";
import { runAgent, type AgentProc } from "../integration/agent-process.ts";

let dir: string;
let port: number;
let hub: AgentProc;
let ca: Awaited<ReturnType<typeof createCa>>;
const DAY = 86_400_000;

beforeAll(async () => {
  dir = tmpDir();
  ca = await createCa();
  const hubCert = await issueCert(ca, { name: "hub", ip: ["127.0.0.1"] });
  writeFileSync(join(dir, "ca.crt"), ca.certPem);
  writeFileSync(join(dir, "hub.crt"), hubCert.certPem);
  writeFileSync(join(dir, "hub.key"), hubCert.keyPem);
  port = freePort();
  const peers = ["good", "expired", "early", "ca-leaf", "no-eku", "rogue"].map((n) => `    - name: ${n}\n      publish: ["t.>"]\n      subscribe: []`).join("\n");
  writeFileSync(
    join(dir, "hub.yaml"),
    `tls:\n  cert: ${dir}/hub.crt\n  key: ${dir}/hub.key\n  ca: ${dir}/ca.crt\naudit:\n  path: ${dir}/audit.log\nhub:\n  listen: 127.0.0.1:${port}\n  peers:\n${peers}\n`,
  );
  hub = await runAgent(join(dir, "hub"), ["--config", join(dir, "hub.yaml")]);
}, 60_000);

afterAll(async () => {
  hub.child.proc.kill("SIGTERM");
  await hub.child.proc.exited;
});

/** Connects with `cert`, sends HELLO, resolves with the CLOSE the hub answered (or null) once it hung up. */
function attempt(cert: CertAndKey): Promise<{ code: string; reason: string } | null> {
  return new Promise((resolve, reject) => {
    const got: Uint8Array[] = [];
    const timer = setTimeout(() => reject(new Error("hub did not close the connection")), 10_000);
    Bun.connect({
      hostname: "127.0.0.1",
      port,
      tls: { ca: ca.certPem, cert: cert.certPem, key: cert.keyPem, serverName: "127.0.0.1" },
      socket: {
        open: (s) => void s.write(helloFrame({ versions: [1], name: "x", mode: "link", publish: ["t.>"], subscribe: [], heartbeatMs: 10_000, maxBatchBytes: 1 << 20 })),
        data: (_s, d) => void got.push(new Uint8Array(d)),
        close: () => {
          clearTimeout(timer);
          const frames = new FrameDecoder(1 << 16).push(Buffer.concat(got));
          resolve(frames.length > 0 ? parseClose(frames[0]!) : null);
        },
        error: () => {},
      },
    }).catch(reject);
  });
}

describe("certificates that must not get in, against a hub process", () => {
  test("rogue CA, expired, not yet valid, CA used as a leaf, no clientAuth, unknown name: each refused, told why, audited", async () => {
    const rogueCa = await createCa({ cn: "rogue-ca" });
    const now = Date.now();
    // [what, certificate, the audited reason, the CLOSE code when the refusal comes after the TLS handshake]
    const cases: [string, CertAndKey, string, string | null][] = [
      ["rogue CA", await issueCert(rogueCa, { name: "rogue" }), "unable to verify the first certificate", null],
      ["expired", await issueCert(ca, { name: "expired", notBefore: new Date(now - 10 * DAY), notAfter: new Date(now - DAY) }), "certificate has expired", null],
      ["not yet valid", await issueCert(ca, { name: "early", notBefore: new Date(now + DAY), notAfter: new Date(now + 10 * DAY) }), "certificate is not yet valid", null],
      ["CA as leaf", await issueCert(ca, { name: "ca-leaf", isCa: true }), "is a CA certificate", "peer_rejected"],
      ["no clientAuth", await issueCert(ca, { name: "no-eku", eku: ["1.3.6.1.5.5.7.3.1"] }), "unsupported certificate purpose", null],
      ["unknown name", await issueCert(ca, { name: "stranger" }), 'unknown peer "stranger"', "unknown_peer"],
    ];
    for (const [what, cert, , code] of cases) {
      // Refused in the TLS handshake itself (OpenSSL's checks: no frame comes back), or right after
      // it by keyop's own checks (a CLOSE saying why). Never a WELCOME.
      const close = await attempt(cert);
      expect({ what, code: close?.code ?? null }).toEqual({ what, code });
    }
    // Each refusal is in the audit trail with its reason, and a good certificate still gets in.
    const audited = async () => (await Bun.file(join(dir, "audit.log")).text()).split("\n").filter((l) => l.includes('"peer_rejected"'));
    await waitFor(async () => (await audited()).length >= cases.length, "all refusals audited");
    const lines = await audited();
    for (const [what, , reason] of cases) expect({ what, audited: lines.some((l) => l.includes(reason.replaceAll('"', '\\"'))) }).toEqual({ what, audited: true });
    const good = await issueCert(ca, { name: "good" });
    const st = await new Promise<string>((resolve, reject) => {
      Bun.connect({
        hostname: "127.0.0.1",
        port,
        tls: { ca: ca.certPem, cert: good.certPem, key: good.keyPem, serverName: "127.0.0.1" },
        socket: {
          open: (s) => void s.write(helloFrame({ versions: [1], name: "good", mode: "link", publish: ["t.>"], subscribe: [], heartbeatMs: 10_000, maxBatchBytes: 1 << 20 })),
          data: (s, d) => {
            resolve(String(new FrameDecoder(1 << 16).push(new Uint8Array(d))[0]?.type));
            s.end();
          },
          error: () => {},
        },
      }).catch(reject);
    });
    expect(st).toBe("2"); // WELCOME
  }, 60_000);

  test("NODE_TLS_REJECT_UNAUTHORIZED=0 in the environment: the agent refuses to start federation", async () => {
    const proc = Bun.spawn([BUN, MAIN, "run", "--config", join(dir, "hub.yaml"), "--data-dir", join(dir, "other"), "--socket", join(dir, "other.sock")], {
      env: { ...process.env, NODE_TLS_REJECT_UNAUTHORIZED: "0" },
      stdout: "pipe",
      stderr: "pipe",
    });
    const [code, err] = await Promise.all([proc.exited, new Response(proc.stderr).text()]);
    expect(code).toBe(2);
    expect(err).toContain("NODE_TLS_REJECT_UNAUTHORIZED");
  });
});
