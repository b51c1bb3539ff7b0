/**
 * TLS material and peer verification for federation (docs/protocol.md).
 *
 * Bun's own checks (`rejectUnauthorized`) are a first gate only: Bun has let
 * bad certificates through before, so after every handshake the peer is
 * verified again here, in code, against the configured CA: signature and
 * issuer, validity, not a CA, the right extended key usage, TLS 1.3. The
 * peer's identity is its certificate's CN, nothing it says later.
 */
import { constants } from "node:crypto";
import { readFile } from "node:fs/promises";
import { assertName } from "../envelope/names.ts";
import { KeyopError, PeerRejectedError } from "../errors.ts";
import { certFromPem, commonName, fingerprint, keyFromPem } from "./certs.ts";
import { x509 } from "./x509.ts";

/** Paths of `tls.{cert,key,ca}`. */
export interface TlsFiles {
  cert: string;
  key: string;
  ca: string;
}

/** Loaded, cross-checked TLS material. */
export interface TlsMaterial {
  files: TlsFiles;
  certPem: string;
  keyPem: string;
  caPem: string;
  ca: x509.X509Certificate;
  own: x509.X509Certificate;
  /** This instance's name: the CN of its certificate. */
  name: string;
}

/** Days before expiry at which the agent starts warning. */
export const EXPIRY_WARN_DAYS = 30;
const DAY_MS = 86_400_000;

async function read(path: string, what: string): Promise<string> {
  try {
    return await readFile(path, "utf8");
  } catch (err) {
    throw new KeyopError("invalid_config", `tls.${what}: cannot read ${path}: ${(err as Error).message}`);
  }
}

/**
 * Reads the three files and checks they belong together: the certificate is
 * signed by the CA, the key is the certificate's key, the CA is a CA.
 */
export async function loadTlsMaterial(files: TlsFiles): Promise<TlsMaterial> {
  const [certPem, keyPem, caPem] = await Promise.all([read(files.cert, "cert"), read(files.key, "key"), read(files.ca, "ca")]);
  const fail = (msg: string) => new KeyopError("invalid_config", msg);
  let ca: x509.X509Certificate, own: x509.X509Certificate, key: CryptoKey;
  try {
    ca = certFromPem(caPem);
  } catch (err) {
    throw fail(`tls.ca: ${files.ca}: ${(err as Error).message}`);
  }
  try {
    own = certFromPem(certPem);
  } catch (err) {
    throw fail(`tls.cert: ${files.cert}: ${(err as Error).message}`);
  }
  try {
    key = await keyFromPem(keyPem);
  } catch (err) {
    throw fail(`tls.key: ${files.key}: ${(err as Error).message}`);
  }
  if (!ca.getExtension(x509.BasicConstraintsExtension)?.ca) throw fail(`tls.ca: ${files.ca} is not a CA certificate`);
  if (own.issuer !== ca.subject || !(await own.verify({ publicKey: ca.publicKey, signatureOnly: true }))) {
    throw fail(`tls.cert: ${files.cert} is not signed by the CA in ${files.ca}`);
  }
  const probe = crypto.getRandomValues(new Uint8Array(32));
  const alg = { name: "ECDSA", hash: (key.algorithm as { namedCurve?: string }).namedCurve === "P-384" ? "SHA-384" : "SHA-256" };
  const sig = await crypto.subtle.sign(alg, key, probe);
  if (!(await crypto.subtle.verify(alg, await own.publicKey.export(), sig, probe))) {
    throw fail(`tls.key: ${files.key} is not the private key of ${files.cert}`);
  }
  const name = commonName(own);
  if (!name) throw fail(`tls.cert: ${files.cert} has no CN`);
  return { files, certPem, keyPem, caPem, ca, own, name };
}

/**
 * Bun TLS options for both ends of a link: our certificate, the CA, a peer
 * certificate required and checked, TLS 1.3 only.
 */
export function bunTlsOptions(m: TlsMaterial): {
  cert: string;
  key: string;
  ca: string;
  requestCert: true;
  rejectUnauthorized: true;
  secureOptions: number;
} {
  return {
    cert: m.certPem,
    key: m.keyPem,
    ca: m.caPem,
    requestCert: true,
    rejectUnauthorized: true,
    secureOptions: constants.SSL_OP_NO_TLSv1 | constants.SSL_OP_NO_TLSv1_1 | constants.SSL_OP_NO_TLSv1_2,
  };
}

/**
 * Bun TLS options for a listener where a client certificate is welcome but
 * not required (MQTT devices that log in with a password), TLS 1.2 or 1.3.
 * A certificate a client does present is verified in code after the
 * handshake (`verifyPeer`), as for federation.
 */
export function bunOptionalClientCertOptions(m: TlsMaterial): { cert: string; key: string; ca: string; requestCert: true; rejectUnauthorized: false; secureOptions: number } {
  return {
    cert: m.certPem,
    key: m.keyPem,
    ca: m.caPem,
    requestCert: true,
    rejectUnauthorized: false,
    secureOptions: constants.SSL_OP_NO_TLSv1 | constants.SSL_OP_NO_TLSv1_1,
  };
}

/** "certificate X expires in N days" for our own and the CA certificate, when within the warning window. */
export function expiryWarnings(m: TlsMaterial, now = Date.now()): string[] {
  const out: string[] = [];
  for (const [what, c] of [
    ["certificate", m.own],
    ["CA certificate", m.ca],
  ] as const) {
    const days = Math.floor((c.notAfter.getTime() - now) / DAY_MS);
    if (days < EXPIRY_WARN_DAYS) out.push(days < 0 ? `${what} ${c.subject} expired ${-days} days ago` : `${what} ${c.subject} expires in ${days} days`);
  }
  return out;
}

/** Who is on the other end, as proven by its certificate. */
export interface PeerIdentity {
  name: string;
  fingerprint: string;
  notAfter: Date;
}

/** The parts of a Bun TLS socket verification reads. */
export interface TlsSocketLike {
  readonly authorized: boolean;
  getTLSVersion(): string;
  getPeerX509Certificate(): { raw: Uint8Array } | undefined;
}

/**
 * Verifies the peer of a finished handshake; `expect` is the role the peer
 * plays (a connecting "client" must have clientAuth, a "server" serverAuth).
 * Throws `PeerRejectedError` with the reason.
 */
export async function verifyPeer(
  socket: TlsSocketLike,
  handshakeOk: boolean,
  authorizationError: Error | null,
  m: TlsMaterial,
  expect: "client" | "server",
  now = new Date(),
  /** Federation speaks 1.3 only; devices on MQTT over TLS (microcontrollers) may speak 1.2. */
  minVersion: "TLSv1.3" | "TLSv1.2" = "TLSv1.3",
): Promise<PeerIdentity> {
  const reject = (reason: string) => new PeerRejectedError(reason);
  if (authorizationError) throw reject(`TLS verification failed: ${authorizationError.message}`);
  if (!handshakeOk || !socket.authorized) throw reject("peer not authorized by the TLS handshake");
  const version = socket.getTLSVersion();
  if (version !== "TLSv1.3" && !(minVersion === "TLSv1.2" && version === "TLSv1.2")) throw reject(`TLS version ${version} (${minVersion === "TLSv1.3" ? "1.3" : "1.2 or later"} required)`);
  let raw: Uint8Array | undefined;
  try {
    raw = socket.getPeerX509Certificate()?.raw;
  } catch {
    raw = undefined;
  }
  if (!raw || raw.length === 0) throw reject("peer sent no certificate");
  let cert: x509.X509Certificate;
  try {
    cert = new x509.X509Certificate(raw);
  } catch (err) {
    throw reject(`peer certificate cannot be parsed: ${(err as Error).message}`);
  }
  if (cert.issuer !== m.ca.subject) throw reject(`certificate of ${cert.subject} is issued by ${cert.issuer}, not by our CA ${m.ca.subject}`);
  if (!(await cert.verify({ publicKey: m.ca.publicKey, signatureOnly: true }))) throw reject(`certificate of ${cert.subject} is not signed by our CA`);
  if (now < cert.notBefore) throw reject(`certificate of ${cert.subject} is not valid before ${cert.notBefore.toISOString()}`);
  if (now > cert.notAfter) throw reject(`certificate of ${cert.subject} expired ${cert.notAfter.toISOString()}`);
  if (cert.getExtension(x509.BasicConstraintsExtension)?.ca) throw reject(`certificate of ${cert.subject} is a CA certificate, not an instance certificate`);
  const eku = cert.getExtension(x509.ExtendedKeyUsageExtension)?.usages.map(String) ?? [];
  const need = expect === "client" ? x509.ExtendedKeyUsage.clientAuth : x509.ExtendedKeyUsage.serverAuth;
  if (!eku.includes(need)) throw reject(`certificate of ${cert.subject} lacks the ${expect === "client" ? "clientAuth" : "serverAuth"} extended key usage`);
  const name = commonName(cert);
  try {
    assertName(name, "certificate CN");
  } catch {
    throw reject(`certificate CN "${name}" is not a usable instance name`);
  }
  return { name, fingerprint: await fingerprint(cert), notAfter: cert.notAfter };
}
