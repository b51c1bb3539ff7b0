/**
 * Certificates for federation, made by the binary itself (no openssl on the
 * board): a CA, and instance certificates it signs. ECDSA P-256 by default
 * (P-384 on request), PKCS#8 keys, 128-bit random serials.
 */
import { InvalidArgumentError } from "../errors.ts";
import { x509 } from "./x509.ts";

/** Key algorithms `keyop cert` offers. */
export type KeyType = "p256" | "p384";

const ALGS: Record<KeyType, { name: "ECDSA"; namedCurve: string; hash: string }> = {
  p256: { name: "ECDSA", namedCurve: "P-256", hash: "SHA-256" },
  p384: { name: "ECDSA", namedCurve: "P-384", hash: "SHA-384" },
};
const DAY_MS = 86_400_000;

/** A certificate with its private key, as objects and as PEM. */
export interface CertAndKey {
  cert: x509.X509Certificate;
  key: CryptoKey;
  certPem: string;
  keyPem: string;
}

/** A positive 128-bit random serial number in hex. */
function serial(): string {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[0]! &= 0x7f;
  if (b[0] === 0) b[0] = 1;
  return Buffer.from(b).toString("hex");
}

async function keyPem(key: CryptoKey): Promise<string> {
  const der = Buffer.from(await crypto.subtle.exportKey("pkcs8", key)).toString("base64");
  return `-----BEGIN PRIVATE KEY-----\n${der.match(/.{1,64}/g)!.join("\n")}\n-----END PRIVATE KEY-----\n`;
}

/** Escapes a value for an RDN string (CN=...). */
function rdn(value: string): string {
  return value.replace(/([,+"\\<>;=#])/g, "\\$1");
}

/** Validity window: from a minute ago (clock skew) for `days`, unless given. */
function window(days: number, notBefore?: Date, notAfter?: Date): { notBefore: Date; notAfter: Date } {
  const nb = notBefore ?? new Date(Date.now() - 60_000);
  return { notBefore: nb, notAfter: notAfter ?? new Date(nb.getTime() + days * DAY_MS) };
}

/** Options of `createCa`. */
export interface CaOptions {
  cn?: string;
  days?: number;
  keyType?: KeyType;
  notBefore?: Date;
  notAfter?: Date;
}

/** A self-signed CA: CA:true, keyCertSign + cRLSign, default CN keyop-ca, 10 years. */
export async function createCa(opts: CaOptions = {}): Promise<CertAndKey> {
  const alg = ALGS[opts.keyType ?? "p256"];
  const keys = (await crypto.subtle.generateKey(alg, true, ["sign", "verify"])) as CryptoKeyPair;
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serial(),
    name: `CN=${rdn(opts.cn ?? "keyop-ca")}`,
    ...window(opts.days ?? 3650, opts.notBefore, opts.notAfter),
    signingAlgorithm: alg,
    keys,
    extensions: [
      new x509.BasicConstraintsExtension(true, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return { cert, key: keys.privateKey, certPem: cert.toString("pem") + "\n", keyPem: await keyPem(keys.privateKey) };
}

/** Options of `issueCert`; `isCa`, `eku` exist so tests can make wrong certificates. */
export interface IssueOptions {
  name: string;
  dns?: string[];
  ip?: string[];
  days?: number;
  keyType?: KeyType;
  notBefore?: Date;
  notAfter?: Date;
  isCa?: boolean;
  eku?: string[];
}

const IPV4 = /^(25[0-5]|2[0-4]\d|1?\d?\d)(\.(25[0-5]|2[0-4]\d|1?\d?\d)){3}$/;
const DNS_NAME = /^(?=.{1,253}$)([A-Za-z0-9_*]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*$/;

/** Throws `InvalidArgumentError` unless `ip` is an IPv4 or IPv6 address. */
export function assertIp(ip: string): void {
  if (IPV4.test(ip)) return;
  if (ip.includes(":") && /^[0-9a-fA-F:.]+$/.test(ip) && ip.split("::").length <= 2) return;
  throw new InvalidArgumentError(`"${ip}" is not an IP address`);
}

/** Throws `InvalidArgumentError` unless `name` can be a DNS name in a SAN. */
export function assertDnsName(name: string): void {
  if (!DNS_NAME.test(name)) throw new InvalidArgumentError(`"${name}" is not a DNS name`);
}

/**
 * An instance certificate signed by `ca`: CA:false, digitalSignature, EKU
 * serverAuth + clientAuth, SAN with the CN as DNS name plus `dns` and `ip`,
 * default 2 years.
 */
export async function issueCert(ca: { cert: x509.X509Certificate; key: CryptoKey }, opts: IssueOptions): Promise<CertAndKey> {
  const alg = ALGS[opts.keyType ?? "p256"];
  const caAlg = ca.key.algorithm as { name: string; namedCurve?: string };
  const signAlg = caAlg.namedCurve === "P-384" ? ALGS.p384 : ALGS.p256;
  const keys = (await crypto.subtle.generateKey(alg, true, ["sign", "verify"])) as CryptoKeyPair;
  const dns = [opts.name, ...(opts.dns ?? [])].filter((d, i, all) => all.indexOf(d) === i);
  for (const d of dns) assertDnsName(d);
  for (const ip of opts.ip ?? []) assertIp(ip);
  const sans = [...dns.map((value) => ({ type: "dns" as const, value })), ...(opts.ip ?? []).map((value) => ({ type: "ip" as const, value }))];
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial(),
    subject: `CN=${rdn(opts.name)}`,
    issuer: ca.cert.subject,
    ...window(opts.days ?? 730, opts.notBefore, opts.notAfter),
    signingAlgorithm: signAlg,
    publicKey: keys.publicKey,
    signingKey: ca.key,
    extensions: [
      new x509.BasicConstraintsExtension(opts.isCa ?? false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature | (opts.isCa ? x509.KeyUsageFlags.keyCertSign : 0), true),
      new x509.ExtendedKeyUsageExtension(opts.eku ?? [x509.ExtendedKeyUsage.serverAuth, x509.ExtendedKeyUsage.clientAuth]),
      new x509.SubjectAlternativeNameExtension(sans),
      await x509.AuthorityKeyIdentifierExtension.create(ca.cert.publicKey),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return { cert, key: keys.privateKey, certPem: cert.toString("pem") + "\n", keyPem: await keyPem(keys.privateKey) };
}

/** Parses the first certificate of a PEM text. */
export function certFromPem(pem: string): x509.X509Certificate {
  const m = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/.exec(pem);
  if (!m) throw new InvalidArgumentError("no PEM certificate found");
  return new x509.X509Certificate(m[0]);
}

/** Imports a PKCS#8 PEM ECDSA key (P-256 or P-384) for signing. */
export async function keyFromPem(pem: string): Promise<CryptoKey> {
  const m = /-----BEGIN PRIVATE KEY-----([\s\S]+?)-----END PRIVATE KEY-----/.exec(pem);
  if (!m) throw new InvalidArgumentError("no PKCS#8 PEM private key found (-----BEGIN PRIVATE KEY-----)");
  const der = Buffer.from(m[1]!.replace(/\s+/g, ""), "base64");
  for (const curve of ["P-256", "P-384"]) {
    try {
      return await crypto.subtle.importKey("pkcs8", der, { name: "ECDSA", namedCurve: curve }, true, ["sign"]);
    } catch {
      // try the other curve
    }
  }
  throw new InvalidArgumentError("private key is not an ECDSA P-256 or P-384 PKCS#8 key");
}

/** The subject's CN of a certificate ("" when it has none). */
export function commonName(cert: x509.X509Certificate): string {
  return cert.subjectName.getField("CN")[0] ?? "";
}

/** SHA-256 fingerprint as colon-separated upper-case hex (as openssl prints it). */
export async function fingerprint(cert: x509.X509Certificate): Promise<string> {
  const h = Buffer.from(await cert.getThumbprint("SHA-256"))
    .toString("hex")
    .toUpperCase();
  return h.match(/../g)!.join(":");
}

/** What `keyop cert inspect` shows. */
export interface CertInfo {
  subject: string;
  issuer: string;
  serial: string;
  not_before: string;
  not_after: string;
  days_left: number;
  dns: string[];
  ip: string[];
  key_usage: string[];
  ext_key_usage: string[];
  is_ca: boolean;
  key: string;
  sha256_fingerprint: string;
}

const EKU_NAMES: Record<string, string> = { [x509.ExtendedKeyUsage.serverAuth]: "serverAuth", [x509.ExtendedKeyUsage.clientAuth]: "clientAuth" };

/** Every field `inspect` prints. */
export async function describeCert(cert: x509.X509Certificate): Promise<CertInfo> {
  const san = cert.getExtension(x509.SubjectAlternativeNameExtension);
  const ku = cert.getExtension(x509.KeyUsagesExtension);
  const eku = cert.getExtension(x509.ExtendedKeyUsageExtension);
  const bc = cert.getExtension(x509.BasicConstraintsExtension);
  const flags = ku
    ? Object.entries(x509.KeyUsageFlags)
        .filter(([k, v]) => typeof v === "number" && Number.isNaN(Number(k)) && (ku.usages & v) !== 0)
        .map(([k]) => k)
    : [];
  const alg = cert.publicKey.algorithm as { name: string; namedCurve?: string };
  return {
    subject: cert.subject,
    issuer: cert.issuer,
    serial: cert.serialNumber,
    not_before: cert.notBefore.toISOString(),
    not_after: cert.notAfter.toISOString(),
    days_left: Math.floor((cert.notAfter.getTime() - Date.now()) / DAY_MS),
    dns: san?.names.items.filter((n) => n.type === "dns").map((n) => n.value) ?? [],
    ip: san?.names.items.filter((n) => n.type === "ip").map((n) => n.value) ?? [],
    key_usage: flags,
    ext_key_usage: (eku?.usages ?? []).map((u) => EKU_NAMES[String(u)] ?? String(u)),
    is_ca: bc?.ca ?? false,
    key: `${alg.name} ${alg.namedCurve ?? ""}`.trim(),
    sha256_fingerprint: await fingerprint(cert),
  };
}
