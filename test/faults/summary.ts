/**
 * `npm run test:faults`: the long version of the fault suite (20 kills,
 * 40 damaged copies per kind of damage, 50,000 random requests, 1,000,000
 * fuzzed frames, a 5-minute soak), then a summary table of what the
 * scenarios reported.
 */
import { join } from "node:path";

const env = { ...process.env, KEYOP_FAULT_KILLS: "20", KEYOP_FAULT_LONG: "1", FUZZ_CASES: "1000000" };
const t0 = performance.now();
const proc = Bun.spawn([process.execPath, "test", "--timeout", "900000", join(import.meta.dir), join(import.meta.dir, "..", "federation", "frame.test.ts")], { env, stdout: "pipe", stderr: "pipe" });
let out = "";
const pump = async (stream: ReadableStream<Uint8Array>, to: NodeJS.WriteStream) => {
  const dec = new TextDecoder();
  for await (const chunk of stream) {
    const text = dec.decode(chunk, { stream: true });
    out += text;
    to.write(text);
  }
};
await Promise.all([pump(proc.stdout, process.stdout), pump(proc.stderr, process.stderr)]);
const code = await proc.exited;
const grab = (re: RegExp) => out.split("\n").filter((l) => re.test(l));
const rows: [string, string][] = [
  ["kill loop", grab(/^kill loop:/)[0]?.replace(/^kill loop: /, "") ?? "not run"],
  ["power loss", `${grab(/^\(pass\) power loss/).length} of 4 kinds passed (${env.KEYOP_FAULT_LONG ? 40 : 4} random positions each)`],
  ["hostile HTTP", grab(/^random requests:/)[0]?.replace(/^random requests: /, "status counts ") ?? "not run"],
  ["frame fuzz", grab(/^fuzz:/)[0]?.replace(/^fuzz: /, "") ?? "not run"],
  ["idle connections", grab(/^idle connections:/)[0]?.replace(/^idle connections: /, "") ?? "not run"],
  ["TLS refusals", grab(/^\(pass\) certificates that must not get in/).length === 2 ? "6 kinds refused and audited; NODE_TLS_REJECT_UNAUTHORIZED=0 refused" : "FAILED"],
  ["network", `${grab(/^\(pass\) a bad network/).length} of 3 passed; ${grab(/^slow network:/)[0] ?? ""}`],
  ...grab(/^soak /).map((l) => ["soak", l.replace(/^soak /, "")] as [string, string]),
];
const pass = /(\d+) pass/.exec(out)?.[1] ?? "0";
const fail = /(\d+) fail/.exec(out)?.[1] ?? "?";
console.log(`\nfault suite (long), ${((performance.now() - t0) / 1000).toFixed(0)} s: ${pass} passed, ${fail} failed`);
const w = Math.max(...rows.map((r) => r[0].length));
for (const [k, v] of rows) console.log(`${k.padEnd(w)}  ${v}`);
process.exit(code);
