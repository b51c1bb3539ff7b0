/**
 * One worker process of the queue-group benchmark (bench/queue.ts): a
 * `LocalClient.subscribe` member of the subscriber's queue group whose
 * handler stands for `WORK_MS` of work (waiting, as on a database or a
 * device), then acks by HTTP. Runs until killed.
 *
 *   bun bench/queue-worker.ts SOCKET CHANNEL NAME WORK_MS PREFETCH
 */
import { LocalClient } from "../src/client/local-client.ts";

const [socket, channel, name, workMs, prefetch] = process.argv.slice(2);
if (!socket || !channel || !name) throw new Error("usage: queue-worker.ts SOCKET CHANNEL NAME WORK_MS PREFETCH");
const work = Number(workMs ?? 0);
const client = new LocalClient({ socket });
const sub = client.subscribe(
  channel,
  name,
  async () => {
    if (work > 0) await Bun.sleep(work);
  },
  { queue: true, maxInflight: Number(prefetch ?? 16), from: "earliest" },
);
process.on("SIGTERM", () => sub.stop());
await sub.done;
