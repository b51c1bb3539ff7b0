import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { spawnLines, tmpDir, waitFor } from "../helpers.ts";
import { cli, runAgent, type AgentProc } from "./agent-process.ts";

const EXAMPLES = join(import.meta.dir, "..", "..", "examples");
let agent: AgentProc;
let dir: string;
beforeAll(async () => {
  dir = tmpDir();
  agent = await runAgent(dir);
});
afterAll(async () => {
  agent.child.proc.kill("SIGTERM");
  await agent.child.proc.exited;
});

const env = () => ({ KEYOP_SOCKET: agent.socket });
async function run(cmd: string[], extraEnv: Record<string, string> = {}) {
  const p = Bun.spawn(cmd, { stdout: "pipe", stderr: "pipe", env: { ...process.env, ...env(), ...extraEnv } });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { out, err, code };
}
const channelInfo = async (ch: string) => ((await (await fetch("http://k/v1/channels", { unix: agent.socket } as RequestInit)).json()) as { channels: any[] }).channels.find((c) => c.channel === ch);

describe("examples in other languages", () => {
  test("Python (stdlib only): publisher, then streaming subscriber with acks", async () => {
    const pub = await run(["python3", join(EXAMPLES, "python/publish.py"), "py.readings", "25"]);
    expect(pub.err).toBe("");
    expect(pub.code).toBe(0);
    const receipts = pub.out
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(receipts.map((r) => r.seq)).toEqual(Array.from({ length: 25 }, (_, i) => i + 1));
    const sub = await run(["python3", join(EXAMPLES, "python/subscribe.py"), "py.readings", "py-reader", "25"]);
    expect(sub.code).toBe(0);
    const got = sub.out
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(got.map((m) => m.payload.n)).toEqual(Array.from({ length: 25 }, (_, i) => i));
    expect(got.map((m) => m.id)).toEqual(receipts.map((r) => r.id));
    await waitFor(async () => (await channelInfo("py.readings")).subscribers.find((s: any) => s.name === "py-reader")?.cursor === 26, "python acks applied");
  });

  test("Python (stdlib only): a responder on a stream answers a request", async () => {
    const responder = spawnLines(["python3", join(EXAMPLES, "python/responder.py"), "py.double", "py-doubler", "1"], env());
    let r = await run(["python3", join(EXAMPLES, "python/request.py"), "py.double", "21"]);
    // The responder's stream may not be attached yet: no_responders until it is.
    await waitFor(
      async () => {
        if (r.code === 0 || !r.err.includes("no_responders")) return true;
        r = await run(["python3", join(EXAMPLES, "python/request.py"), "py.double", "21"]);
        return false;
      },
      "the python responder attached",
      10_000,
      50,
    );
    expect(r.err).toBe("");
    expect(r.code).toBe(0);
    const reply = JSON.parse(r.out);
    expect(reply).toMatchObject({ type: "doubled", payload: { doubled: 42 } });
    expect(await responder.proc.exited).toBe(0);
  });

  test("shell: publish, pull and ack with curl --unix-socket", async () => {
    const r = await run(["sh", join(EXAMPLES, "shell/pubsub.sh"), "sh.events", "sh-reader"]);
    expect(r.err).toBe("");
    expect(r.code).toBe(0);
    const lines = r.out.trim().split("\n");
    expect(JSON.parse(lines[0]!)).toMatchObject({ channel: "sh.events", seq: 1 });
    expect(JSON.parse(lines[2]!).messages.map((m: any) => m.payload.door)).toEqual(["open", "closed"]);
    expect(JSON.parse(lines[3]!)).toMatchObject({ channel: "sh.events", cursor: 3 });
  });

  test("shell: two curl workers of one queue group share the messages, each handled once", async () => {
    const body = Array.from({ length: 20 }, (_, i) => JSON.stringify({ type: "job", payload: i })).join("\n") + "\n";
    await fetch("http://k/v1/channels/sh.jobs/messages", { method: "POST", body, headers: { "content-type": "application/x-ndjson" }, unix: agent.socket } as RequestInit);
    // Ten each: neither can finish unless the other takes its share.
    const [w1, w2] = await Promise.all([run(["sh", join(EXAMPLES, "shell/worker.sh"), "sh.jobs", "sh-workers", "10"]), run(["sh", join(EXAMPLES, "shell/worker.sh"), "sh.jobs", "sh-workers", "10"])]);
    for (const w of [w1, w2]) {
      expect(w.err).toBe("");
      expect(w.code).toBe(0);
    }
    const seqs = [w1, w2].flatMap((w) =>
      w.out
        .trim()
        .split("\n")
        .map((l) => Number(l.split(" ")[0])),
    );
    expect(seqs.sort((a, b) => a - b)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
    await waitFor(async () => (await channelInfo("sh.jobs")).subscribers.find((s: any) => s.name === "sh-workers")?.cursor === 21, "all acked");
  });

  test("C: compiled with cc, publishes over POSIX sockets", async () => {
    const bin = join(tmpDir(), "publish");
    const cc = await run(["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", bin, join(EXAMPLES, "c/publish.c")]);
    expect(cc.err).toBe("");
    expect(cc.code).toBe(0);
    const r = await run([bin, agent.socket, "c.demo", '{"from":"c","v":[1,2,3]}']);
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/^201 \{"id":"[0-9a-f-]+","channel":"c.demo","seq":1,"ts":\d+\}/);
    const bad = await run([bin, agent.socket, "c..bad", "1"]);
    // Compared as one object so that a failure also shows what the C program said on stderr.
    expect({ code: bad.code, out: bad.out, err: bad.err }).toEqual({ code: 1, out: expect.stringMatching(/^400 .*"invalid_channel"/), err: "" });
  });
});

describe("CLI", () => {
  test("pub (argument and stdin), pull with ack, --no-ack", async () => {
    const one = await cli(["pub", "cli.a", '{"x":1}', "--type", "demo", "--correlation-id", "c9", "--service", "svc"], { env: env() });
    expect(one.code).toBe(0);
    expect(JSON.parse(one.out)).toMatchObject({ channel: "cli.a", seq: 1 });
    const many = await cli(["pub", "cli.a", "-"], { env: env(), stdin: '{"x":2}\n\n{"x":3}\n"four"' });
    expect(many.code).toBe(0);
    expect(
      many.out
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l).seq),
    ).toEqual([2, 3, 4]);
    const peek = await cli(["pull", "cli.a", "--name", "reader", "--no-ack", "--max", "2"], { env: env() });
    expect(peek.out).toBe(""); // a new subscriber starts at latest
    expect(peek.err).toContain("a new subscriber starts at latest (--from earliest reads cli.a from its start)");
    await cli(["pub", "cli.a", "5"], { env: env() });
    let p = await cli(["pull", "cli.a", "--name", "reader", "--no-ack"], { env: env() });
    expect(
      p.out
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l).payload),
    ).toEqual([5]);
    p = await cli(["pull", "cli.a", "--name", "reader"], { env: env() });
    expect(
      p.out
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l).payload),
    ).toEqual([5]);
    p = await cli(["pull", "cli.a", "--name", "reader", "--wait", "0.2"], { env: env() });
    expect(p.out).toBe("");
    const first = JSON.parse(one.out);
    const all = await cli(["pull", "cli.a", "--name", "fresh", "--max", "1"], { env: env() });
    expect(all.out).toBe("");
    const hist = await fetch(`http://k/v1/channels/cli.a/messages?subscriber=hist&from=earliest&max=1`, { unix: agent.socket } as RequestInit);
    expect(((await hist.json()) as any).messages[0]).toMatchObject({ id: first.id, type: "demo", correlation_id: "c9", service_name: "svc" });
    // --from, as for sub: a new name reads from the start, or from a seq.
    const early = await cli(["pull", "cli.a", "--name", "early", "--from", "earliest", "--max", "2"], { env: env() });
    expect(
      early.out
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l).seq),
    ).toEqual([1, 2]);
    expect(early.err).toBe("");
    const next = await cli(["pull", "cli.a", "--name", "early"], { env: env() });
    expect(
      next.out
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l).seq),
    ).toEqual([3, 4, 5]);
    const at = await cli(["pull", "cli.a", "--name", "at4", "--from", "4"], { env: env() });
    expect(
      at.out
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l).seq),
    ).toEqual([4, 5]);
    const bad = await cli(["pull", "cli.a", "--name", "x", "--from", "soon"], { env: env() });
    expect(bad.code).toBe(2);
    expect(bad.err).toContain("--from must be earliest, latest or a seq >= 1");
  });

  test("sub prints envelopes and acks them; --max stops; --socket flag works", async () => {
    for (let i = 1; i <= 3; i++) await cli(["pub", "cli.sub", String(i)], { env: env() });
    const r = await cli(["sub", "cli.sub", "--name", "s1", "--from", "earliest", "--max", "3", "--socket", agent.socket]);
    expect(r.code).toBe(0);
    expect(
      r.out
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l).payload),
    ).toEqual([1, 2, 3]);
    expect((await channelInfo("cli.sub")).subscribers.find((s: any) => s.name === "s1").cursor).toBe(4);
  });

  test("sub --exec acks only when the command exits 0, retrying otherwise", async () => {
    const work = tmpDir();
    const script = join(work, "handler.sh");
    // Fails the first time it sees seq 2, then succeeds; records every envelope it handled.
    writeFileSync(
      script,
      `#!/bin/sh\nset -e\ncat > "${work}/last.json"\nif [ "$KEYOP_SEQ" = 2 ] && [ ! -e "${work}/failed-once" ]; then touch "${work}/failed-once"; exit 3; fi\necho "$KEYOP_CHANNEL $KEYOP_SEQ" >> "${work}/done.txt"\n`,
    );
    for (let i = 1; i <= 3; i++) await cli(["pub", "cli.exec", String(i)], { env: env() });
    const r = await cli(["sub", "cli.exec", "--name", "x", "--from", "earliest", "--exec", `sh ${script}`, "--max", "3"], { env: env() });
    expect(r.code).toBe(0);
    expect(await Bun.file(join(work, "done.txt")).text()).toBe("cli.exec 1\ncli.exec 2\ncli.exec 3\n");
    expect(r.err).toContain("--exec exited 3 for cli.exec seq 2 (attempt 1)");
    expect(JSON.parse(await Bun.file(join(work, "last.json")).text())).toMatchObject({ seq: 3, payload: 3 });
  });

  test("sub keeps going across an agent restart (reconnects, resumes at the acked cursor)", async () => {
    const d = tmpDir();
    let a2 = await runAgent(d);
    const sub = spawnLines([process.execPath, join(import.meta.dir, "..", "..", "src", "main.ts"), "sub", "cli.rs", "--name", "r", "--from", "earliest", "--max", "4"], { KEYOP_SOCKET: a2.socket });
    await cli(["pub", "cli.rs", "1"], { env: { KEYOP_SOCKET: a2.socket } });
    await cli(["pub", "cli.rs", "2"], { env: { KEYOP_SOCKET: a2.socket } });
    await waitFor(() => sub.lines.length === 2, "two before restart");
    // At-least-once: only once the ack of 2 is applied may we expect no redelivery of 2.
    await waitFor(async () => {
      const c = ((await (await fetch("http://k/v1/channels", { unix: a2.socket } as RequestInit)).json()) as { channels: any[] }).channels;
      return c.find((x) => x.channel === "cli.rs")?.subscribers.find((s: any) => s.name === "r")?.cursor === 3;
    }, "ack of 2 applied");
    a2.child.proc.kill("SIGTERM");
    await a2.child.proc.exited;
    a2 = await runAgent(d);
    await cli(["pub", "cli.rs", "3"], { env: { KEYOP_SOCKET: a2.socket } });
    await cli(["pub", "cli.rs", "4"], { env: { KEYOP_SOCKET: a2.socket } });
    expect(await sub.proc.exited).toBe(0);
    expect(sub.lines.map((l) => JSON.parse(l).payload)).toEqual([1, 2, 3, 4]);
    a2.child.proc.kill("SIGTERM");
    await a2.child.proc.exited;
  }, 60_000);

  test("channels, status, version, help, and exit codes", async () => {
    const ch = await cli(["channels"], { env: env() });
    expect(ch.code).toBe(0);
    expect(ch.out.split("\n")[0]).toMatch(/^CHANNEL\s+FIRST\s+NEXT\s+MESSAGES\s+BYTES\s+SUBSCRIBERS/);
    expect(JSON.parse((await cli(["channels", "--json"], { env: env() })).out).channels.length).toBeGreaterThan(0);
    const st = await cli(["status"], { env: env() });
    expect(st.out).toMatch(/^name: +\S+/m);
    expect(JSON.parse((await cli(["status", "--json"], { env: env() })).out).pid).toBe(agent.child.proc.pid);
    expect((await cli(["version"])).out).toMatch(/^keyop \d+\.\d+\.\d+ \(commit \w+, bun [\d.]+, linux-\w+\)\n$/);
    for (const c of ["run", "pub", "sub", "pull", "channels", "status", "version"]) {
      const h = await cli([c, "--help"]);
      expect(h.code).toBe(0);
      expect(h.out).toStartWith(`usage: keyop ${c}`);
    }
    const usage: string[][] = [["pub"], ["pub", "a", "{bad"], ["sub", "a"], ["pull", "a", "--name"], ["nope"], ["pull", "a", "--name", "x", "--max", "0"], ["channels", "extra"]];
    for (const args of usage) {
      const r = await cli(args, { env: env() });
      expect(r.code).toBe(2);
      expect(r.err.trim().split("\n").length).toBe(1);
    }
    const down = await cli(["status"], { env: { KEYOP_SOCKET: join(dir, "nothing.sock") } });
    expect(down.code).toBe(1);
    expect(down.err).toContain("cannot reach keyop at");
    const refused = await cli(["pub", "a..b", "1"], { env: env() });
    expect(refused.code).toBe(1);
    expect(refused.err).toContain('channel "a..b" has an empty token');
  }, 60_000);
});
