#!/usr/bin/env node
// A cloud service beside a keyop hub tier, with nats.js alone (docs/scale-out.md):
// reads what boards sent on CHANNEL from the JetStream stream, prints one JSON
// line per message, then sends board "board" a command through the CMD stream.
//
//   node examples/nats/service.mjs nats://127.0.0.1:4222 telemetry.board-7.temp
//
// Subject = "kp." + channel; the body is the keyop envelope as msgpack.
import { Packr } from "msgpackr";
import { connect, headers } from "nats";

const [server = "nats://127.0.0.1:4222", channel = "telemetry.>"] = process.argv.slice(2);
const prefix = "kp";
const unpack = new Packr({ useRecords: false, mapsAsObjects: true }).unpack;

const nc = await connect({ servers: server.replace(/^nats:\/\//, "") });
const js = nc.jetstream();
const jsm = await nc.jetstreamManager();

// Which stream holds the channel, then an ordered consumer from its first message.
const stream = await jsm.streams.find(`${prefix}.${channel}`);
const info = await jsm.streams.info(stream, { subjects_filter: `${prefix}.${channel}` });
const stored = Object.values(info.state.subjects ?? {}).reduce((a, b) => a + b, 0);
if (stored > 0) {
  const consumer = await js.consumers.get(stream, { filterSubjects: `${prefix}.${channel}` });
  const messages = await consumer.consume();
  for await (const m of messages) {
    const e = unpack(m.data);
    console.log(JSON.stringify({ seq: m.seq, id: e.id, channel: e.channel, origin: e.origin, type: e.type, route: e.route, payload: e.payload }));
    if (m.info.pending === 0) break; // everything stored so far is read
  }
}

// A command: plain JSON; the hub wraps it into an envelope for the board.
const h = headers();
h.set("Keyop-Type", "reboot");
h.set("Keyop-Origin", "ops");
await js.publish(`${prefix}.cmd.board.example`, JSON.stringify({ after_s: 5 }), { headers: h });
await nc.drain();
