import { describe, expect, test } from "bun:test";
import { readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { tmpDir } from "../helpers.ts";
import { cli } from "../integration/agent-process.ts";

const openssl = (args: string[]) => {
  const r = Bun.spawnSync(["openssl", ...args], { stdout: "pipe", stderr: "pipe" });
  return { code: r.exitCode, out: r.stdout.toString() + r.stderr.toString() };
};

describe("keyop cert", () => {
  test("ca + issue: files, modes, and openssl agrees on the chain and every field", async () => {
    const d = tmpDir();
    const ca = await cli(["cert", "ca", "--out-dir", d, "--cn", "fleet-ca"]);
    expect(ca.code).toBe(0);
    expect(ca.out).toContain(`wrote ${join(d, "ca.crt")} and ${join(d, "ca.key")}`);
    expect(ca.out).toMatch(/SHA-256 fingerprint ([0-9A-F]{2}:){31}[0-9A-F]{2}/);
    const iss = await cli(["cert", "issue", "--name", "dev1", "--ca-dir", d, "--out-dir", d, "--dns", "dev1.lan", "--ip", "127.0.0.1", "--ip", "::1", "--days", "90"]);
    expect(iss.code).toBe(0);
    for (const f of ["ca.key", "dev1.key"]) expect(statSync(join(d, f)).mode & 0o777).toBe(0o600);
    for (const f of ["ca.crt", "dev1.crt"]) expect(statSync(join(d, f)).mode & 0o777).toBe(0o644);
    expect(readFileSync(join(d, "dev1.key"), "utf8")).toStartWith("-----BEGIN PRIVATE KEY-----");
    const v = openssl(["verify", "-CAfile", join(d, "ca.crt"), join(d, "dev1.crt")]);
    expect(v.out).toContain(": OK");
    expect(v.code).toBe(0);
    const caText = openssl(["x509", "-in", join(d, "ca.crt"), "-noout", "-text"]).out;
    expect(caText).toContain("Subject: CN = fleet-ca");
    expect(caText).toMatch(/Basic Constraints: critical\s+CA:TRUE/);
    expect(caText).toMatch(/Key Usage: critical\s+Certificate Sign, CRL Sign/);
    expect(caText).toContain("ASN1 OID: prime256v1");
    const text = openssl(["x509", "-in", join(d, "dev1.crt"), "-noout", "-text"]).out;
    expect(text).toContain("Issuer: CN = fleet-ca");
    expect(text).toContain("Subject: CN = dev1");
    expect(text).toMatch(/Basic Constraints: critical\s+CA:FALSE/);
    expect(text).toMatch(/Key Usage: critical\s+Digital Signature/);
    expect(text).toContain("TLS Web Server Authentication, TLS Web Client Authentication");
    expect(text).toContain("DNS:dev1, DNS:dev1.lan, IP Address:127.0.0.1, IP Address:0:0:0:0:0:0:0:1");
    expect(text).toContain("ecdsa-with-SHA256");
    const serial = /Serial Number:\s*\n?\s*([0-9a-f:]+)/.exec(text)![1]!.replace(/:/g, "");
    expect(serial.length).toBeGreaterThanOrEqual(30); // 128-bit random
    const days = (Date.parse(/Not After : (.*)/.exec(text)![1]!) - Date.now()) / 86_400_000;
    expect(days).toBeGreaterThan(88);
    expect(days).toBeLessThan(91);
    // The key really is the certificate's key: openssl sees the same public key.
    const pubFromKey = openssl(["pkey", "-in", join(d, "dev1.key"), "-pubout"]).out;
    const pubFromCert = openssl(["x509", "-in", join(d, "dev1.crt"), "-noout", "-pubkey"]).out;
    expect(pubFromKey).toBe(pubFromCert);
  });

  test("p384 keys, and inspect (text and --json) matches openssl's fingerprint", async () => {
    const d = tmpDir();
    expect((await cli(["cert", "ca", "--out-dir", d, "--key-type", "p384"])).code).toBe(0);
    expect((await cli(["cert", "issue", "--name", "hub", "--ca-dir", d, "--out-dir", d, "--key-type", "p384"])).code).toBe(0);
    expect(openssl(["verify", "-CAfile", join(d, "ca.crt"), join(d, "hub.crt")]).code).toBe(0);
    expect(openssl(["x509", "-in", join(d, "hub.crt"), "-noout", "-text"]).out).toContain("ecdsa-with-SHA384");
    const j = JSON.parse((await cli(["cert", "inspect", join(d, "hub.crt"), "--json"])).out);
    const fp = openssl(["x509", "-in", join(d, "hub.crt"), "-noout", "-fingerprint", "-sha256"])
      .out.trim()
      .split("=")[1];
    expect(j).toMatchObject({
      subject: "CN=hub",
      issuer: "CN=keyop-ca",
      dns: ["hub"],
      ip: [],
      is_ca: false,
      key: "ECDSA P-384",
      ext_key_usage: ["serverAuth", "clientAuth"],
      key_usage: ["digitalSignature"],
    });
    expect(j.sha256_fingerprint).toBe(fp);
    expect(j.days_left).toBe(729);
    const t = await cli(["cert", "inspect", join(d, "ca.crt")]);
    expect(t.out).toMatch(/^CA: +yes$/m);
    expect(t.out).toMatch(/^valid: .*\(3649 days left\)$/m);
  });

  test("never overwrites without --force; bad arguments exit 2 with one line", async () => {
    const d = tmpDir();
    await cli(["cert", "ca", "--out-dir", d]);
    const before = readFileSync(join(d, "ca.key"), "utf8");
    const again = await cli(["cert", "ca", "--out-dir", d]);
    expect(again.code).toBe(1);
    expect(again.err).toContain("exists; use --force");
    expect(readFileSync(join(d, "ca.key"), "utf8")).toBe(before);
    expect((await cli(["cert", "ca", "--out-dir", d, "--force"])).code).toBe(0);
    expect(readFileSync(join(d, "ca.key"), "utf8")).not.toBe(before);
    const usage: string[][] = [
      ["cert", "issue", "--ca-dir", d],
      ["cert", "issue", "--name", "a/b", "--ca-dir", d],
      ["cert", "issue", "--name", "x", "--ca-dir", d, "--ip", "300.1.1.1"],
      ["cert", "issue", "--name", "x", "--ca-dir", d, "--dns", "bad name"],
      ["cert", "ca", "--out-dir", d, "--days", "0"],
      ["cert", "ca", "--key-type", "rsa"],
      ["cert", "frobnicate"],
      ["cert", "inspect"],
    ];
    for (const args of usage) {
      const r = await cli(args);
      expect([args.join(" "), r.code]).toEqual([args.join(" "), 2]);
      expect(r.err.trim().split("\n").length).toBe(1);
    }
    const noCa = await cli(["cert", "issue", "--name", "x", "--ca-dir", join(d, "nowhere")]);
    expect(noCa.code).toBe(1);
    expect(noCa.err).toContain('make one with "keyop cert ca"');
  }, 30_000);
});
