import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { createCa, issueCert, type CertAndKey } from "../../src/pki/certs.ts";
import { connectMtls, MtlsServer, type MtlsHandler } from "../../src/pki/mtls.ts";
import { expiryWarnings, loadTlsMaterial, verifyPeer, type TlsMaterial } from "../../src/pki/tls.ts";
import { x509 } from "../../src/pki/x509.ts";
import { silentLogger } from "../../src/observability/logger.ts";
import { tmpDir, waitFor } from "../helpers.ts";

let dir: string;
let ca: CertAndKey;
let rogue: CertAndKey;
let hub: TlsMaterial;
const DAY = 86_400_000;

async function material(name: string, c: CertAndKey, caPem = ca.certPem): Promise<TlsMaterial> {
  const files = { cert: join(dir, `${name}.crt`), key: join(dir, `${name}.key`), ca: join(dir, `${name}-ca.crt`) };
  writeFileSync(files.cert, c.certPem);
  writeFileSync(files.key, c.keyPem);
  writeFileSync(files.ca, caPem);
  return loadTlsMaterial(files);
}

/** A server whose application records everything it is handed. */
function server(m: TlsMaterial) {
  const seen = { opened: [] as string[], data: [] as string[], rejected: [] as string[] };
  const handler: MtlsHandler<unknown> = {
    open: (s, peer) => {
      seen.opened.push(peer.name);
      s.write(`welcome ${peer.name}`);
    },
    data: (_s, c) => void seen.data.push(new TextDecoder().decode(c)),
  };
  const srv = MtlsServer.listen({ hostname: "127.0.0.1", port: 0, material: m, logger: silentLogger, onReject: (reason) => seen.rejected.push(reason) }, handler);
  return { srv, seen };
}

/** A client that sends a line as soon as TLS is up (before any verification could finish). */
async function rawClient(port: number, tls: Record<string, unknown>) {
  const out = { closed: false, data: "" };
  await Bun.connect({
    hostname: "127.0.0.1",
    port,
    tls: { ...tls, rejectUnauthorized: false },
    socket: {
      open: (s) => void s.write("application bytes\n"),
      handshake: (s) => void s.write("more application bytes\n"),
      data: (_s, d) => void (out.data += new TextDecoder().decode(d)),
      close: () => void (out.closed = true),
      error: () => void (out.closed = true),
    },
  }).catch(() => (out.closed = true));
  return out;
}

beforeAll(async () => {
  dir = tmpDir();
  ca = await createCa({ cn: "fleet-ca" });
  rogue = await createCa({ cn: "fleet-ca" }); // same name, different key
  hub = await material("hub", await issueCert(ca, { name: "hub", ip: ["127.0.0.1"] }));
});

describe("mutual TLS", () => {
  let srv: ReturnType<typeof server>;
  beforeAll(() => {
    srv = server(hub);
  });
  afterAll(() => srv.srv.stop(true));

  test("a good pair connects; each side sees the other's CN; data flows only after verification", async () => {
    const dev = await material("dev1", await issueCert(ca, { name: "dev1" }));
    const got: string[] = [];
    const sock = await connectMtls(
      { hostname: "127.0.0.1", port: srv.srv.port, material: dev, logger: silentLogger },
      {
        open: (s, peer) => {
          got.push(`client sees ${peer.name}`);
          s.write("hello from dev1");
        },
        data: (_s, c) => void got.push(new TextDecoder().decode(c)),
      },
    );
    await waitFor(() => got.length === 2 && srv.seen.data.length === 1, "exchange");
    expect(got).toEqual(["client sees hub", "welcome dev1"]);
    expect(srv.seen.opened).toEqual(["dev1"]);
    expect(srv.seen.data).toEqual(["hello from dev1"]);
    sock.end();
  });

  const bad: [string, () => Promise<Record<string, unknown>>, RegExp][] = [
    ["no client certificate", async () => ({ ca: ca.certPem }), /no certificate|not authorized|TLS verification failed/],
    [
      "a certificate from a rogue CA with the same name",
      async () => {
        const c = await issueCert(rogue, { name: "dev-rogue" });
        return { cert: c.certPem, key: c.keyPem, ca: ca.certPem };
      },
      /not signed by our CA|TLS verification failed|not authorized/,
    ],
    [
      "an expired certificate",
      async () => {
        const c = await issueCert(ca, { name: "dev-old", notBefore: new Date(Date.now() - 10 * DAY), notAfter: new Date(Date.now() - DAY) });
        return { cert: c.certPem, key: c.keyPem, ca: ca.certPem };
      },
      /expired|TLS verification failed/,
    ],
    [
      "a certificate not yet valid",
      async () => {
        const c = await issueCert(ca, { name: "dev-future", notBefore: new Date(Date.now() + DAY), notAfter: new Date(Date.now() + 10 * DAY) });
        return { cert: c.certPem, key: c.keyPem, ca: ca.certPem };
      },
      /not valid before|not yet valid|TLS verification failed/,
    ],
    [
      "a CA certificate used as a leaf",
      async () => {
        const c = await issueCert(ca, { name: "dev-ca", isCa: true });
        return { cert: c.certPem, key: c.keyPem, ca: ca.certPem };
      },
      /is a CA certificate|TLS verification failed/,
    ],
    [
      "a certificate without clientAuth",
      async () => {
        const c = await issueCert(ca, { name: "dev-server-only", eku: [x509.ExtendedKeyUsage.serverAuth] });
        return { cert: c.certPem, key: c.keyPem, ca: ca.certPem };
      },
      /lacks the clientAuth|TLS verification failed|unsupported certificate purpose/,
    ],
  ];
  test.each(bad)("refused: %s (closed, logged, no application byte read)", async (_what, make, reason) => {
    const before = { opened: srv.seen.opened.length, data: srv.seen.data.length, rejected: srv.seen.rejected.length };
    const c = await rawClient(srv.srv.port, await make());
    await waitFor(() => c.closed, "connection closed by the server");
    await waitFor(() => srv.seen.rejected.length === before.rejected + 1, "rejection reported");
    expect(srv.seen.rejected.at(-1)).toMatch(reason);
    if (process.env.SHOW_REASONS) console.log(`${_what}: ${srv.seen.rejected.at(-1)}`);
    expect(srv.seen.opened.length).toBe(before.opened);
    expect(srv.seen.data.length).toBe(before.data);
    expect(c.data).toBe("");
  });

  test("a client refuses a server whose certificate comes from a rogue CA", async () => {
    const fake = server(await material("fake-hub", await issueCert(rogue, { name: "hub", ip: ["127.0.0.1"] }), rogue.certPem));
    const dev = await material("dev2", await issueCert(ca, { name: "dev2" }));
    const rejected: string[] = [];
    let opened = false;
    try {
      await connectMtls(
        { hostname: "127.0.0.1", port: fake.srv.port, material: dev, logger: silentLogger, onReject: (r) => rejected.push(r) },
        {
          open: () => void (opened = true),
          data: () => {},
        },
      ).catch(() => rejected.push("connect failed"));
      await waitFor(() => rejected.length > 0, "client-side rejection");
      expect(opened).toBe(false);
      expect(fake.seen.data).toEqual([]);
    } finally {
      fake.srv.stop(true);
    }
  });

  test("reload: new connections get the new certificate, established ones stay up", async () => {
    const s = server(hub);
    const dev = await material("dev3", await issueCert(ca, { name: "dev3" }));
    const fps: string[] = [];
    const msgs: string[] = [];
    const connect = () =>
      connectMtls<unknown>(
        { hostname: "127.0.0.1", port: s.srv.port, material: dev, logger: silentLogger },
        {
          open: (_s, peer) => void fps.push(peer.fingerprint),
          data: (_s, c) => void msgs.push(new TextDecoder().decode(c)),
        },
      );
    const first = await connect();
    await waitFor(() => fps.length === 1, "first connection");
    const hub2 = await material("hub2", await issueCert(ca, { name: "hub", ip: ["127.0.0.1"] }));
    s.srv.reload(hub2);
    const second = await connect();
    await waitFor(() => fps.length === 2, "second connection");
    expect(fps[0]).not.toBe(fps[1]);
    first.write("still here");
    await waitFor(() => s.seen.data.includes("still here"), "old connection still carries data");
    first.end();
    second.end();
    s.srv.stop(true);
  });
});

describe("TLS material", () => {
  test("files that do not belong together are refused with the reason", async () => {
    const dev = await issueCert(ca, { name: "devx" });
    const other = await issueCert(ca, { name: "devy" });
    await expect(material("mismatch", { ...dev, keyPem: other.keyPem })).rejects.toThrow("is not the private key of");
    await expect(material("wrongca", dev, rogue.certPem)).rejects.toThrow("is not signed by the CA");
    await expect(material("leafasca", dev, dev.certPem)).rejects.toThrow("is not a CA certificate");
    await expect(loadTlsMaterial({ cert: join(dir, "none.crt"), key: join(dir, "none.key"), ca: join(dir, "none-ca.crt") })).rejects.toThrow("cannot read");
  });

  test("expiry warnings within 30 days, for the instance and the CA certificate", async () => {
    const soon = await material("soon", await issueCert(ca, { name: "soon", days: 10 }));
    expect(expiryWarnings(soon)).toEqual([expect.stringMatching(/^certificate CN=soon expires in (9|10) days$/)]);
    expect(expiryWarnings(hub)).toEqual([]);
    expect(expiryWarnings(hub, Date.now() + 3640 * DAY)).toHaveLength(2);
  });
});

describe("verification in code, as if Bun had let the certificate through", () => {
  const lying = (c: CertAndKey | null, version = "TLSv1.3") => ({
    authorized: true,
    getTLSVersion: () => version,
    getPeerX509Certificate: () => (c ? { raw: new Uint8Array(c.cert.rawData) } : undefined),
  });
  const cases: [string, () => Promise<CertAndKey | null>, string, "client" | "server"][] = [
    ["no certificate", async () => null, "peer sent no certificate", "client"],
    ["rogue CA, same issuer name", async () => issueCert(rogue, { name: "r" }), "is not signed by our CA", "client"],
    ["expired", async () => issueCert(ca, { name: "e", notBefore: new Date(Date.now() - 10 * DAY), notAfter: new Date(Date.now() - DAY) }), "expired", "client"],
    ["not yet valid", async () => issueCert(ca, { name: "f", notBefore: new Date(Date.now() + DAY), notAfter: new Date(Date.now() + 2 * DAY) }), "is not valid before", "client"],
    ["CA as leaf", async () => issueCert(ca, { name: "c", isCa: true }), "is a CA certificate", "client"],
    ["no clientAuth", async () => issueCert(ca, { name: "s", eku: [x509.ExtendedKeyUsage.serverAuth] }), "lacks the clientAuth", "client"],
    ["no serverAuth", async () => issueCert(ca, { name: "s", eku: [x509.ExtendedKeyUsage.clientAuth] }), "lacks the serverAuth", "server"],
    ["another CA's name", async () => issueCert(await createCa({ cn: "other-ca" }), { name: "o" }), "not by our CA", "client"],
  ];
  test.each(cases)("%s", async (_what, make, reason, role) => {
    await expect(verifyPeer(lying(await make()), true, null, hub, role)).rejects.toThrow(reason);
  });

  test("TLS below 1.3, a handshake error, or not authorized", async () => {
    const good = await issueCert(ca, { name: "g" });
    await expect(verifyPeer(lying(good, "TLSv1.2"), true, null, hub, "client")).rejects.toThrow("1.3 required");
    await expect(verifyPeer(lying(good), false, new Error("boom"), hub, "client")).rejects.toThrow("TLS verification failed: boom");
    await expect(verifyPeer({ ...lying(good), authorized: false }, true, null, hub, "client")).rejects.toThrow("not authorized");
    expect((await verifyPeer(lying(good), true, null, hub, "client")).name).toBe("g");
  });
});
