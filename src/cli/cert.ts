/**
 * `keyop cert ca | issue | inspect`: the operator makes and checks the
 * federation certificates with the binary itself, no openssl needed on the
 * board. Keys are written 0600, certificates 0644; nothing is overwritten
 * without --force.
 */
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { assertName } from "../envelope/names.ts";
import { KeyopError } from "../errors.ts";
import { certFromPem, createCa, describeCert, fingerprint, issueCert, keyFromPem, type KeyType } from "../pki/certs.ts";
import { intFlag, parseArgs, UsageError, type Parsed } from "./args.ts";

/** Usage text of `keyop cert`. */
export const CERT_USAGE = `usage: keyop cert ca      [--out-dir DIR] [--cn NAME] [--days N] [--key-type p256|p384] [--force]
       keyop cert issue   --name CN [--ca-dir DIR] [--out-dir DIR] [--dns NAME]... [--ip ADDR]... [--days N] [--key-type p256|p384] [--force]
       keyop cert inspect FILE [--json]

ca      writes ca.crt and ca.key: a CA (default CN keyop-ca, 10 years, ECDSA P-256).
issue   writes <CN>.crt and <CN>.key signed by the CA in --ca-dir (default .):
        serverAuth + clientAuth, SAN with the CN plus --dns/--ip, 2 years.
inspect prints subject, issuer, serial, validity, SANs, usages and the SHA-256
        fingerprint of a certificate.
Keys are written with mode 0600; existing files are kept unless --force.`;

function keyType(p: Parsed): KeyType {
  const v = (p.flags["key-type"] as string | undefined) ?? "p256";
  if (v !== "p256" && v !== "p384") throw new UsageError("--key-type must be p256 or p384");
  return v;
}

/** Refuses to overwrite unless forced; then writes both files with their modes. */
function writePair(dir: string, base: string, certPem: string, keyPem: string, force: boolean): { cert: string; key: string } {
  const cert = join(dir, `${base}.crt`);
  const key = join(dir, `${base}.key`);
  if (!force) for (const f of [cert, key]) if (existsSync(f)) throw new KeyopError("invalid_argument", `${f} exists; use --force to replace it`);
  mkdirSync(dir, { recursive: true });
  writeFileSync(key, keyPem, { mode: 0o600 });
  chmodSync(key, 0o600);
  writeFileSync(cert, certPem, { mode: 0o644 });
  chmodSync(cert, 0o644);
  return { cert, key };
}

async function cmdCa(argv: string[]): Promise<number> {
  const p = parseArgs(argv, { "out-dir": "string", cn: "string", days: "string", "key-type": "string", force: "boolean" }, 0);
  if (p.help) return (void console.log(CERT_USAGE), 0);
  const cn = (p.flags.cn as string | undefined) ?? "keyop-ca";
  const ca = await createCa({ cn, days: intFlag(p, "days", 3650), keyType: keyType(p) });
  const files = writePair((p.flags["out-dir"] as string | undefined) ?? ".", "ca", ca.certPem, ca.keyPem, !!p.flags.force);
  console.log(`wrote ${files.cert} and ${files.key} (mode 0600)`);
  console.log(`CA "${cn}" valid until ${ca.cert.notAfter.toISOString()}, SHA-256 fingerprint ${await fingerprint(ca.cert)}`);
  return 0;
}

async function cmdIssue(argv: string[]): Promise<number> {
  const p = parseArgs(argv, { name: "string", "ca-dir": "string", "out-dir": "string", dns: "multi", ip: "multi", days: "string", "key-type": "string", force: "boolean" }, 0);
  if (p.help) return (void console.log(CERT_USAGE), 0);
  const name = p.flags.name as string | undefined;
  if (!name) throw new UsageError("--name is required");
  try {
    assertName(name, "--name");
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const caDir = (p.flags["ca-dir"] as string | undefined) ?? ".";
  let caPem: string, caKeyPem: string;
  try {
    caPem = readFileSync(join(caDir, "ca.crt"), "utf8");
    caKeyPem = readFileSync(join(caDir, "ca.key"), "utf8");
  } catch (err) {
    throw new KeyopError("invalid_argument", `cannot read the CA in ${caDir} (ca.crt, ca.key): ${(err as Error).message}; make one with "keyop cert ca"`);
  }
  const ca = { cert: certFromPem(caPem), key: await keyFromPem(caKeyPem) };
  let issued: Awaited<ReturnType<typeof issueCert>>;
  try {
    issued = await issueCert(ca, { name, dns: (p.flags.dns as string[] | undefined) ?? [], ip: (p.flags.ip as string[] | undefined) ?? [], days: intFlag(p, "days", 730), keyType: keyType(p) });
  } catch (err) {
    if (err instanceof KeyopError && err.code === "invalid_argument") throw new UsageError(err.message);
    throw err;
  }
  const files = writePair((p.flags["out-dir"] as string | undefined) ?? ".", name, issued.certPem, issued.keyPem, !!p.flags.force);
  console.log(`wrote ${files.cert} and ${files.key} (mode 0600)`);
  console.log(`"${name}" signed by ${ca.cert.subject}, valid until ${issued.cert.notAfter.toISOString()}, SHA-256 fingerprint ${await fingerprint(issued.cert)}`);
  return 0;
}

async function cmdInspect(argv: string[]): Promise<number> {
  const p = parseArgs(argv, { json: "boolean" }, 1);
  if (p.help) return (void console.log(CERT_USAGE), 0);
  const file = p.positionals[0];
  if (!file) throw new UsageError("FILE is required");
  let pem: string;
  try {
    pem = readFileSync(file, "utf8");
  } catch (err) {
    throw new KeyopError("invalid_argument", `cannot read ${file}: ${(err as Error).message}`);
  }
  const info = await describeCert(certFromPem(pem));
  if (p.flags.json) return (void console.log(JSON.stringify(info, null, 2)), 0);
  console.log(
    [
      `subject:      ${info.subject}`,
      `issuer:       ${info.issuer}`,
      `serial:       ${info.serial}`,
      `valid:        ${info.not_before} to ${info.not_after} (${info.days_left < 0 ? `expired ${-info.days_left} days ago` : `${info.days_left} days left`})`,
      `dns names:    ${info.dns.join(", ") || "-"}`,
      `ip addresses: ${info.ip.join(", ") || "-"}`,
      `key usage:    ${info.key_usage.join(", ") || "-"}`,
      `ext usage:    ${info.ext_key_usage.join(", ") || "-"}`,
      `CA:           ${info.is_ca ? "yes" : "no"}`,
      `key:          ${info.key}`,
      `sha256:       ${info.sha256_fingerprint}`,
    ].join("\n"),
  );
  return 0;
}

/** `keyop cert <ca|issue|inspect>`. */
export async function cmdCert(argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === undefined || sub === "--help" || sub === "-h") {
    console.log(CERT_USAGE);
    return sub === undefined ? 2 : 0;
  }
  if (sub === "ca") return cmdCa(rest);
  if (sub === "issue") return cmdIssue(rest);
  if (sub === "inspect") return cmdInspect(rest);
  throw new UsageError(`unknown cert command "${sub}" (ca, issue or inspect)`);
}
