/**
 * `keyop sub`: a durable subscriber on the command line. Prints one envelope
 * JSON per line and acks it once written; with `--exec` runs the command
 * per message (envelope on stdin) and acks only when it exits 0, retrying
 * with backoff otherwise: at-least-once into shell scripts. Survives agent
 * restarts by reconnecting (the stream resumes at the acked cursor).
 */
import { envelopeJson } from "../envelope/json.ts";
import type { Message } from "../envelope/envelope.ts";
import { LocalClient } from "../client/local-client.ts";
import { parseDuration } from "../config/units.ts";
import { fromFlag, intFlag, parseArgs, UsageError } from "./args.ts";

/** Usage text of `keyop sub`. */
export const SUB_USAGE = `usage: keyop sub CHANNEL --name NAME [--from earliest|latest|SEQ] [--exec CMD [--reply]] [--queue [--key FIELD] [--ack-wait DURATION]] [--max N] [--socket PATH]

Streams messages of CHANNEL (or a pattern such as sensors.>) to the durable
subscriber NAME: one envelope JSON per line on stdout, acked once printed.
With --exec, CMD runs (via sh -c) once per message with the envelope on
stdin and KEYOP_CHANNEL, KEYOP_SEQ, KEYOP_ID, KEYOP_TYPE set; the message is
acked only when CMD exits 0, otherwise retried with backoff. --max N stops
after N messages. A new subscriber starts at --from (default latest).
With --reply, CMD's stdout answers a message that is a request (it has
reply_to): as JSON when it parses, else as a string (type "reply").
With --queue, this process is one worker of NAME's queue group: every
worker started with the same NAME gets its share, each message acked by
itself; what a worker had not acked when it died goes to another. --key
FIELD sends messages with the same payload FIELD to the same worker while
it lives; --ack-wait (default 30s, 0 for never) is how long a message may
go unacked before another worker gets it.`;

/** Streams until --max, a signal, or a fatal error; resolves with the exit code. */
export async function cmdSub(argv: string[]): Promise<number> {
  const p = parseArgs(argv, { name: "string", from: "string", exec: "string", reply: "boolean", max: "string", socket: "string", queue: "boolean", key: "string", "ack-wait": "string" }, 1);
  if (p.help) {
    console.log(SUB_USAGE);
    return 0;
  }
  const channel = p.positionals[0];
  if (!channel) throw new UsageError("CHANNEL is required");
  const name = p.flags.name as string | undefined;
  if (!name) throw new UsageError("--name is required");
  const from = fromFlag(p);
  const max = intFlag(p, "max", undefined);
  const exec = p.flags.exec as string | undefined;
  const answer = p.flags.reply === true;
  if (answer && !exec) throw new UsageError("--reply needs --exec (its stdout is the reply)");
  const queue = p.flags.queue === true;
  const key = p.flags.key as string | undefined;
  if (key !== undefined && !queue) throw new UsageError("--key needs --queue");
  let ackWaitMs: number | undefined;
  if (p.flags["ack-wait"] !== undefined) {
    if (!queue) throw new UsageError("--ack-wait needs --queue");
    const ms = parseDuration(p.flags["ack-wait"] as string);
    if (ms === null || ms < 0) throw new UsageError(`--ack-wait ${JSON.stringify(p.flags["ack-wait"])} is not a duration such as 500ms, 30s or 5m`);
    ackWaitMs = Math.round(ms);
  }
  const client = new LocalClient({ socket: p.flags.socket as string | undefined });
  const abort = new AbortController();
  const onSignal = () => abort.abort();
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  process.stdout.on?.("error", () => abort.abort()); // reader went away (| head): stop quietly

  let handled = 0;
  let reported = false;
  try {
    // One implementation of reconnect and ack: LocalClient.subscribe.
    const sub = client.subscribe(
      channel,
      name,
      async (msg) => {
        reported = false;
        if (exec) {
          const out = await runUntilSuccess(exec, msg, abort.signal, answer);
          if (out === null) throw new Error("stopped");
          if (answer && msg.replyTo) await sendReply(client, msg, out);
        } else {
          process.stdout.write(envelopeJson(msg) + "\n");
        }
        if (max !== undefined && ++handled >= max) abort.abort();
      },
      {
        from,
        queue,
        key,
        ackWaitMs,
        // A worker of a group takes a few at a time: the others get the rest meanwhile.
        maxInflight: exec ? 1 : queue ? 16 : 100,
        signal: abort.signal,
        onError: (err) => {
          // The agent restarting or gone for a while: the stream resumes at the acked cursor.
          if (!reported) process.stderr.write(`keyop sub: ${err instanceof Error ? err.message : String(err)}; reconnecting\n`);
          reported = true;
        },
      },
    );
    await sub.done;
    return 0;
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}

/** The reply to `msg` from a handler's output: JSON when it parses, else the text. */
async function sendReply(client: LocalClient, msg: Message, out: string): Promise<void> {
  let payload: unknown = out.replace(/\n$/, "");
  try {
    payload = JSON.parse(out);
  } catch {
    // not JSON: the text is the reply
  }
  try {
    await client.reply(msg, "reply", payload);
  } catch (err) {
    // The requester gave up waiting: the message is handled all the same.
    process.stderr.write(`keyop sub: the reply to ${msg.id} was not taken: ${err instanceof Error ? err.message : String(err)}\n`);
  }
}

/**
 * Runs `cmd` for `msg` until it exits 0 (resolves with its stdout when
 * `capture`, else "") or the subscriber is stopped (null).
 */
async function runUntilSuccess(cmd: string, msg: Message, signal: AbortSignal, capture = false): Promise<string | null> {
  let delay = 500;
  for (let attempt = 1; !signal.aborted; attempt++) {
    const proc = Bun.spawn(["sh", "-c", cmd], {
      stdin: new TextEncoder().encode(envelopeJson(msg) + "\n"),
      stdout: capture ? "pipe" : "inherit",
      stderr: "inherit",
      env: { ...process.env, KEYOP_CHANNEL: msg.channel, KEYOP_SEQ: String(msg.seq), KEYOP_ID: msg.id, KEYOP_TYPE: msg.type },
    });
    const out = capture ? await new Response(proc.stdout as ReadableStream).text() : "";
    const code = await proc.exited;
    if (code === 0) return out;
    process.stderr.write(`keyop sub: --exec exited ${code} for ${msg.channel} seq ${msg.seq} (attempt ${attempt}), retrying in ${delay} ms\n`);
    await new Promise<void>((r) => {
      const t = setTimeout(r, delay);
      signal.addEventListener("abort", () => (clearTimeout(t), r()), { once: true });
    });
    delay = Math.min(delay * 2, 30_000);
  }
  return null;
}
