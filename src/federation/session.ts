/**
 * One federation connection after TLS verification: frames in and out with
 * write backpressure, the HELLO/WELCOME handshake, heartbeats that notice a
 * peer gone silent (no FIN needed), and closing with a reason. Protocol
 * bytes are parsed by frame.ts/messages.ts; what batches mean is up to the
 * hub and link code above this.
 */
import { CopyBlocks } from "../bytes.ts";
import type { Logger } from "../observability/logger.ts";
import type { PeerIdentity } from "../pki/tls.ts";
import type { MtlsSocket } from "../pki/mtls.ts";
import type { AuditLog } from "./audit.ts";
import { heartbeatStep } from "./heartbeat.ts";
import { FrameDecoder, FrameError, FrameType, frameTypeName, type Frame } from "./frame.ts";
import { chooseCodec, type Codec, compressFrame, decompressFrame, isCodec } from "./compression.ts";
import { OutQueue } from "../net/out-queue.ts";
import {
  chooseVersion,
  closeFrame,
  helloFrame,
  parseAck,
  parseBatch,
  parseClose,
  parseHello,
  parsePing,
  parseReply,
  parseWelcome,
  pingFrame,
  pongFrame,
  welcomeFrame,
  type Ack,
  type Batch,
  type Hello,
  type Reply,
  type Welcome,
} from "./messages.ts";

/** Outbound bytes above which `send` asks the caller to wait for `writable()`. */
export const HIGH_WATER_BYTES = 4 * 1024 * 1024;
/** A connection that has not finished HELLO/WELCOME by then is closed. */
export const HANDSHAKE_TIMEOUT_MS = 10_000;

/** How a session is set up. */
export interface SessionOptions {
  role: "client" | "hub";
  /** Largest frame body accepted from the peer. */
  maxBody: number;
  /** Heartbeat period until the handshake settles one. */
  heartbeatMs: number;
  logger: Logger;
  audit?: AuditLog | undefined;
  handshakeTimeoutMs?: number;
  /** Codecs this side compresses BATCHes with, preferred first (a client offers them, a hub picks one); none when absent. */
  compression?: readonly Codec[];
  /** Where the session copies what its socket hands it; the sessions of one listener share one. */
  inbound?: CopyBlocks;
}

/** BATCH bytes through a session: as encoded, and as on the wire (after compression). */
export interface WireBytes {
  sentRaw: number;
  sentWire: number;
  receivedRaw: number;
  receivedWire: number;
}

/** What the code above a session hears. */
export interface SessionEvents {
  /** Hub: decide the answer to a HELLO (a Welcome, or a refusal reason). */
  onHello?(s: PeerSession, hello: Hello): Welcome | { refuse: string; code: string };
  /** Both: the handshake is done. */
  onOpen?(s: PeerSession): void;
  onBatch?(s: PeerSession, batch: Batch): void;
  onAck?(s: PeerSession, ack: Ack): void;
  onReply?(s: PeerSession, reply: Reply): void;
  /** Both: the session ended (any reason); called once. */
  onClose?(s: PeerSession, reason: string): void;
}

/** Per-socket data slot the session lives in. */
export type SessionSocket = MtlsSocket<PeerSession>;

/**
 * What a session needs of its connection: a verified TLS socket in the
 * agent, an in-memory pipe in tests. The session hears back through
 * `receive`, `drained` and `transportClosed`.
 */
export interface SessionTransport {
  /** Writes what it can now; returns the bytes taken (fewer, or -1: the rest waits for `drained`). */
  write(bytes: Uint8Array): number;
  /** Ends the connection once what was written is out. */
  end(): void;
  /** Ends the connection at once (a peer that no longer reads). */
  terminate(): void;
}

/** A federation session on one verified connection. */
export class PeerSession {
  /** Who the peer is, from its certificate. */
  readonly peer: PeerIdentity;
  readonly role: "client" | "hub";
  readonly connectedAt = Date.now();
  state: "handshaking" | "open" | "closed" = "handshaking";
  hello: Hello | undefined;
  welcome: Welcome | undefined;
  /** Last measured round trip (PING to PONG), ms. */
  rttMs: number | undefined;
  /** The CLOSE frame the peer ended the session with, if it sent one. */
  peerClose: { code: string; reason: string } | undefined;
  /** The codec agreed in the handshake, if any. */
  codec: Codec | undefined;
  readonly wire: WireBytes = { sentRaw: 0, sentWire: 0, receivedRaw: 0, receivedWire: 0 };
  private readonly transport: SessionTransport;
  private readonly opts: SessionOptions;
  private readonly events: SessionEvents;
  private readonly decoder: FrameDecoder;
  private readonly out: OutQueue;
  private lastRecv = Date.now();
  private lastSent = Date.now();
  private heartbeatMs: number;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private handshakeTimer: ReturnType<typeof setTimeout> | null = null;

  /** A session on `transport` with the verified `peer`; the caller feeds it `receive`, `drained` and `transportClosed`. */
  constructor(transport: SessionTransport, peer: PeerIdentity, opts: SessionOptions, events: SessionEvents) {
    this.transport = transport;
    this.peer = peer;
    this.role = opts.role;
    this.opts = opts;
    this.events = events;
    this.decoder = new FrameDecoder(opts.maxBody, opts.inbound);
    this.out = new OutQueue((b) => transport.write(b), HIGH_WATER_BYTES);
    this.heartbeatMs = opts.heartbeatMs;
    this.handshakeTimer = setTimeout(() => this.state === "handshaking" && this.close("handshake_timeout", "no handshake within the time limit"), opts.handshakeTimeoutMs ?? HANDSHAKE_TIMEOUT_MS);
    this.startHeartbeat();
  }

  /** Client: opens the handshake. */
  sendHello(h: Hello): void {
    this.hello = h;
    this.send(helloFrame(h));
  }

  /**
   * Queues bytes for the peer, written at the end of this turn with the
   * rest of the turn's frames (see OutQueue), or with `now` in the call,
   * after what is queued. Returns false when more than HIGH_WATER_BYTES
   * wait: the caller should await `writable()` before more.
   */
  send(bytes: Uint8Array, now = false): boolean {
    if (this.state === "closed") return false;
    this.lastSent = Date.now();
    return now ? this.out.pushNow(bytes) : this.out.push(bytes);
  }

  /**
   * The bytes to send for a data frame (a BATCH): compressed with the
   * agreed codec when that pays, else as they are. Counted either way.
   */
  pack(frame: Uint8Array): Uint8Array {
    const wire = this.codec ? compressFrame(this.codec, frame) : frame;
    this.wire.sentRaw += frame.length;
    this.wire.sentWire += wire.length;
    return wire;
  }

  /** Resolves once the outbound buffer is below the high-water mark (or closed). */
  writable(): Promise<void> {
    return this.out.writable();
  }

  /** Times the transport had been full and took bytes again. */
  drains = 0;

  /** The transport has room again: write what is queued. */
  drained(): void {
    this.drains++;
    this.out.drained();
  }

  /** Bytes from the peer. */
  receive(chunk: Uint8Array): void {
    if (this.state === "closed") return;
    this.lastRecv = Date.now();
    let frames: Frame[];
    try {
      frames = this.decoder.push(chunk);
      for (const f of frames) {
        if ((this.state as string) === "closed") return; // a frame may have closed it
        this.dispatch(f);
      }
    } catch (err) {
      const reason = err instanceof FrameError ? err.message : `protocol error: ${String(err)}`;
      this.opts.audit?.record("malformed_frame", { peer: this.peer.name, reason });
      this.close("malformed_frame", reason);
    }
  }

  private dispatch(f: Frame): void {
    switch (f.type) {
      case FrameType.PING: {
        const p = parsePing(f);
        this.send(pongFrame(p));
        // The dialer's own measurement, for the side that answers and does not ping (heartbeat.ts).
        if (p.r !== undefined) this.rttMs = p.r;
        return;
      }
      case FrameType.PONG:
        this.rttMs = Math.max(0, Date.now() - parsePing(f).t);
        return;
      case FrameType.CLOSE: {
        const c = parseClose(f);
        this.peerClose = c;
        this.finish(`peer closed: ${c.code}: ${c.reason}`);
        this.transport.end();
        return;
      }
    }
    if (this.state === "handshaking") return this.handshake(f);
    switch (f.type) {
      case FrameType.BATCH:
        this.events.onBatch?.(this, parseBatch(f));
        return;
      case FrameType.COMPRESSED: {
        const inner = decompressFrame(f, this.codec, this.opts.maxBody);
        this.wire.receivedRaw += inner.size;
        this.wire.receivedWire += f.size;
        this.events.onBatch?.(this, parseBatch(inner));
        return;
      }
      case FrameType.ACK:
        this.events.onAck?.(this, parseAck(f));
        return;
      case FrameType.REPLY:
        this.events.onReply?.(this, parseReply(f));
        return;
      default:
        throw new FrameError(`unexpected ${frameTypeName(f.type)} after the handshake`);
    }
  }

  private handshake(f: Frame): void {
    if (this.role === "hub") {
      const hello = parseHello(f);
      const version = chooseVersion(hello.versions);
      if (version === null) return this.close("version", `no common protocol version (peer speaks ${hello.versions.join(", ")})`);
      const answer = this.events.onHello?.(this, hello);
      if (!answer) return this.close("refused", "hub takes no peers");
      if ("refuse" in answer) return this.close(answer.code, answer.refuse);
      this.hello = hello;
      this.codec = chooseCodec(hello.compression ?? [], this.opts.compression ?? []);
      this.welcome = this.codec ? { ...answer, compression: this.codec } : answer;
      this.send(welcomeFrame(this.welcome));
    } else {
      const welcome = parseWelcome(f);
      const c = welcome.compression;
      if (c !== undefined && (!isCodec(c) || !(this.hello?.compression ?? []).includes(c))) throw new FrameError(`WELCOME chose codec ${JSON.stringify(c)}, which was not offered`);
      this.welcome = welcome;
      this.codec = c;
    }
    this.heartbeatMs = this.welcome.heartbeatMs;
    this.state = "open";
    if (this.handshakeTimer) clearTimeout(this.handshakeTimer);
    this.restartHeartbeat();
    this.events.onOpen?.(this);
  }

  /** Arms the one heartbeat timer for the next moment something is due (see heartbeat.ts). */
  private startHeartbeat(delayMs = heartbeatStep(Date.now(), this.lastRecv, this.lastSent, this.heartbeatMs, this.role === "hub").nextInMs): void {
    this.timer = setTimeout(this.heartbeatTick, delayMs);
    this.timer.unref?.();
  }

  private readonly heartbeatTick = (): void => {
    this.timer = null;
    if (this.state === "closed") return;
    const now = Date.now();
    const step = heartbeatStep(now, this.lastRecv, this.lastSent, this.heartbeatMs, this.role === "hub");
    if (step.action === "dead") {
      // Nothing for three periods: the peer or the path is gone, FIN or not.
      this.close("heartbeat", `no frame from ${this.peer.name} for ${now - this.lastRecv} ms (3 heartbeats)`, { hard: true });
      return;
    }
    if (step.action === "ping") this.send(pingFrame(this.rttMs === undefined ? { t: now } : { t: now, r: this.rttMs }));
    // (A failed send may have closed the session meanwhile.)
    if ((this.state as string) !== "closed") this.startHeartbeat(step.nextInMs);
  };

  private restartHeartbeat(): void {
    if (this.timer) clearTimeout(this.timer);
    this.startHeartbeat();
  }

  /**
   * Sends CLOSE with `code` and `reason`, then ends the connection
   * (`hard`: at once, for a peer that no longer reads).
   */
  close(code: string, reason: string, how: { hard?: boolean } = {}): void {
    const hard = how.hard === true;
    if (this.state === "closed") return;
    if (!hard) {
      try {
        this.send(closeFrame({ code, reason }));
        this.out.flushNow(); // now: the connection ends below
      } catch {
        // the reason is logged below either way
      }
    }
    this.finish(`${code}: ${reason}`);
    if (hard) this.transport.terminate();
    else this.transport.end();
  }

  /** The transport closed. */
  transportClosed(): void {
    this.finish("connection closed");
  }

  private finish(reason: string): void {
    if (this.state === "closed") return;
    this.state = "closed";
    if (this.timer) clearTimeout(this.timer);
    if (this.handshakeTimer) clearTimeout(this.handshakeTimer);
    this.out.close();
    this.opts.logger.info("federation session closed", { peer: this.peer.name, role: this.role, reason });
    this.events.onClose?.(this, reason);
  }
}

/** MtlsHandler that runs a PeerSession per connection. */
export function sessionHandler(
  opts: SessionOptions,
  events: SessionEvents,
  onSession?: (s: PeerSession) => void,
): {
  open(socket: SessionSocket, peer: PeerIdentity): void;
  data(socket: SessionSocket, chunk: Uint8Array): void;
  drain(socket: SessionSocket): void;
  close(socket: SessionSocket): void;
} {
  // Sessions by socket, held here rather than on socket.data: on Bun 1.4.4 a value set on a
  // TLS server socket's data from inside the verification callback was not seen by the next
  // data callback (the session test in test/federation/forward.test.ts hung on it).
  const sessions = new WeakMap<object, PeerSession>();
  const shared: SessionOptions = opts.inbound ? opts : { ...opts, inbound: new CopyBlocks() };
  return {
    open(socket, peer) {
      const s = new PeerSession(socket, peer, shared, events);
      sessions.set(socket, s);
      onSession?.(s);
    },
    data(socket, chunk) {
      sessions.get(socket)?.receive(chunk);
    },
    drain(socket) {
      sessions.get(socket)?.drained();
    },
    close(socket) {
      sessions.get(socket)?.transportClosed();
      sessions.delete(socket);
    },
  };
}
