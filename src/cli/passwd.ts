/**
 * `keyop passwd`: hashes a password for `mqtt.users[].password_hash`
 * (argon2id, salted), reading it from stdin so it stays out of shell
 * history and `ps`.
 */
import { parseArgs } from "./args.ts";

/** Usage text of `keyop passwd`. */
export const PASSWD_USAGE = `usage: keyop passwd < password-file
       printf '%s' "$PASSWORD" | keyop passwd

Reads a password from stdin (one line; the newline is not part of it) and
prints its argon2id hash for mqtt.users[].password_hash in the config.`;

/** Prints the hash of the password on stdin. */
export async function cmdPasswd(argv: string[]): Promise<number> {
  const p = parseArgs(argv, {}, 0);
  if (p.help) {
    console.log(PASSWD_USAGE);
    return 0;
  }
  const input = (await new Response(Bun.stdin.stream()).text()).replace(/\r?\n$/, "");
  if (input.length === 0) {
    process.stderr.write("keyop passwd: no password on stdin\n");
    return 2;
  }
  console.log(await Bun.password.hash(input, { algorithm: "argon2id" }));
  return 0;
}
