/**
 * Step 9 of `npm run bench:compare`: request/reply round trips, one at a
 * time (the next request goes when the reply is in), after a warm-up.
 *
 * - keyop in one agent: the requester and a responder are `LocalClient`s
 *   in this process (HTTP over the Unix socket; the responder on an NDJSON
 *   stream, answering by POSTing its reply and acking).
 * - keyop hub -> board -> hub: the requester on the hub's socket, the
 *   responder on the board's, the request forwarded over the link (mutual
 *   TLS) and the reply back in a REPLY frame.
 * - NATS: nats.js `request` to a responder on the same nats-server, and
 *   from the hub to a responder connected to a leaf node.
 *
 * keyop runs with `sync: none` here: NATS core request/reply keeps
 * nothing, and a keyop request is a stored message (with `sync: always`
 * every hop adds an fdatasync). Bound by: the clients' round trips on
 * both sides (one request in flight); keyop's client is HTTP, NATS's its
 * own protocol on one connection.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { connect as natsConnect } from "nats";
import { LocalClient } from "../src/client/local-client.ts";
import { createCa, issueCert } from "../src/pki/certs.ts";
import { type Proc, start, status, stop, until } from "./fed-lib.ts";
import { quantile, type Row } from "./lib.ts";
import { freePort, type Servers } from "./servers.ts";

export interface RequestBenchOptions {
  servers: Servers;
  quick: boolean;
}

interface Trips {
  p50: number;
  p99: number;
  n: number;
}

async function trips(n: number, warm: number, one: () => Promise<unknown>): Promise<Trips> {
  for (let i = 0; i < warm; i++) await one();
  const ms: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await one();
    ms.push(performance.now() - t0);
  }
  return { p50: quantile(ms, 0.5), p99: quantile(ms, 0.99), n };
}

/** A LocalClient responder on `socket` for `pattern`, echoing the payload. */
function responder(socket: string, pattern: string) {
  const c = new LocalClient({ socket });
  return c.subscribe(pattern, "bench-responder", async (msg) => {
    if (msg.replyTo) await c.reply(msg, "echo", msg.payload);
  });
}

async function untilAnswered(c: LocalClient, channel: string): Promise<void> {
  await until(
    "a responder attached",
    async () => {
      try {
        await c.request(channel, "ping", {}, { timeoutMs: 2000 });
        return true;
      } catch {
        return false;
      }
    },
    30_000,
    50,
  );
}

export async function requestReply(o: RequestBenchOptions): Promise<Row[]> {
  const N = o.quick ? 300 : 2000;
  const WARM = o.quick ? 100 : 500;
  const G = "9 request/reply";
  const rows: Row[] = [];
  const row = (what: string, t: Trips, note: string) => {
    rows.push({ group: G, metric: `${what}: round trip p50`, value: t.p50, unit: "ms", note: `${t.n} requests one at a time after ${WARM}; ${note}` });
    rows.push({ group: G, metric: `${what}: round trip p99`, value: t.p99, unit: "ms" });
  };
  const payload = { pad: "x".repeat(200) };

  // keyop, one agent
  {
    const dir = o.servers.dir("request-local");
    const a = await start(dir, "agent", "", "none");
    const sub = responder(a.socket, "svc.echo");
    try {
      const c = new LocalClient({ socket: a.socket });
      await untilAnswered(c, "svc.echo");
      console.log("  request/reply: keyop, one agent");
      row("keyop, one agent", await trips(N, WARM, () => c.request("svc.echo", "ask", payload, { timeoutMs: 5000 })), "LocalClient requester and responder (HTTP on the Unix socket)");
    } finally {
      sub.stop();
      await sub.done.catch(() => {});
      await stop(a);
    }
  }

  // keyop, hub -> board -> hub
  {
    const dir = o.servers.dir("request-fleet");
    const ca = await createCa();
    writeFileSync(join(dir, "ca.crt"), ca.certPem);
    for (const name of ["hub", "board"]) {
      const c = await issueCert(ca, { name, ip: ["127.0.0.1"] });
      writeFileSync(join(dir, `${name}.crt`), c.certPem);
      writeFileSync(join(dir, `${name}.key`), c.keyPem);
    }
    const tls = (name: string) => `tls:\n  cert: ${dir}/${name}.crt\n  key: ${dir}/${name}.key\n  ca: ${dir}/ca.crt\n`;
    const port = freePort();
    const procs: Proc[] = [];
    try {
      procs.push(await start(dir, "hub", tls("hub") + `hub:\n  listen: 127.0.0.1:${port}\n  peers:\n    - {name: board, publish: [], subscribe: ["cmd.>"]}\n`, "none"));
      procs.push(
        await start(dir, "board", tls("board") + `federation:\n  reconnect_base_ms: 100ms\n  reconnect_max_ms: 500ms\nlinks:\n  - hub: 127.0.0.1:${port}\n    subscribe: ["cmd.>"]\n`, "none"),
      );
      const [hub, board] = procs as [Proc, Proc];
      await until("the board's link open", async () => (await status(board)).links[0]?.state === "open");
      const sub = responder(board.socket, "cmd.>");
      try {
        const c = new LocalClient({ socket: hub.socket });
        await untilAnswered(c, "cmd.echo");
        console.log("  request/reply: keyop, hub -> board -> hub");
        row("keyop, hub -> board -> hub", await trips(N, WARM, () => c.request("cmd.echo", "ask", payload, { timeoutMs: 5000 })), "over a link (mutual TLS); responder on the board");
      } finally {
        sub.stop();
        await sub.done.catch(() => {});
      }
    } finally {
      for (const p of procs.reverse()) await stop(p);
    }
  }

  // NATS, one server and across a leaf node
  {
    const t = await o.servers.natsTrio("request-nats");
    try {
      const hubNc = await natsConnect({ servers: `127.0.0.1:${t.hub.port}` });
      const leafNc = await natsConnect({ servers: `127.0.0.1:${t.a.port}` });
      const body = new TextEncoder().encode(JSON.stringify(payload));
      for (const nc of [hubNc, leafNc]) {
        const subj = nc === hubNc ? "svc.local" : "svc.leaf";
        const s = nc.subscribe(subj);
        void (async () => {
          for await (const m of s) m.respond(m.data);
        })();
        await nc.flush();
      }
      await until(
        "the leaf's responder seen from the hub",
        async () => {
          try {
            await hubNc.request("svc.leaf", body, { timeout: 1000 });
            return true;
          } catch {
            return false;
          }
        },
        30_000,
        50,
      );
      console.log("  request/reply: nats");
      row("NATS, one server", await trips(N, WARM, () => hubNc.request("svc.local", body, { timeout: 5000 })), "nats.js requester and responder on one connection each");
      row("NATS, hub -> leaf -> hub", await trips(N, WARM, () => hubNc.request("svc.leaf", body, { timeout: 5000 })), "responder connected to a leaf node");
      await hubNc.close();
      await leafNc.close();
    } finally {
      for (const s of [t.a, t.b, t.hub]) await o.servers.kill(s);
    }
  }
  return rows;
}
