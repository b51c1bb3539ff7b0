/**
 * Typed errors with stable codes.
 *
 * Every failure a caller can act on has its own class and a `code` string that
 * never changes between releases, so that the HTTP API, the CLI and programs in
 * other languages can branch on it without parsing messages.
 */

/** Stable machine-readable error codes; the HTTP API maps them to status codes. */
export type ErrorCode =
  | "invalid_channel"
  | "invalid_pattern"
  | "invalid_name"
  | "reserved_channel"
  | "invalid_argument"
  | "too_large"
  | "disk_full"
  | "buffer_full"
  | "timeout"
  | "no_responders"
  | "no_request"
  | "unreachable"
  | "io_error"
  | "log_unavailable"
  | "locked"
  | "closed"
  | "unknown_subscriber"
  | "decode_failed"
  | "invalid_config"
  | "unknown_channel"
  | "bad_request"
  | "not_found"
  | "method_not_allowed"
  | "unsupported_media_type"
  | "shutting_down"
  | "in_use"
  | "conflict"
  | "peer_rejected"
  | "malformed_frame"
  | "conn_lost"
  | "not_connected"
  | "forbidden"
  | "aborted"
  | "unavailable";

/** Base class so callers can catch every keyop error with one `instanceof`. */
export class KeyopError extends Error {
  readonly code: ErrorCode;
  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.name = new.target.name;
  }
}

/** A channel name breaks the naming rules (docs/api.md, "Names"); raised before anything touches the disk. */
export class InvalidChannelError extends KeyopError {
  constructor(message: string) {
    super("invalid_channel", message);
  }
}

/** A subscription or ACL pattern breaks the naming rules (docs/api.md, "Names"). */
export class InvalidPatternError extends KeyopError {
  constructor(message: string) {
    super("invalid_pattern", message);
  }
}

/** A subscriber or instance name is not usable as a file name component. */
export class InvalidNameError extends KeyopError {
  constructor(message: string) {
    super("invalid_name", message);
  }
}

/** Publishing into `*.dead-letter` is reserved for keyop itself. */
export class ReservedChannelError extends KeyopError {
  constructor(channel: string) {
    super("reserved_channel", `channel "${channel}" is reserved for dead letters`);
  }
}

/** A caller passed something that is not a valid argument (type name, option). */
export class InvalidArgumentError extends KeyopError {
  constructor(message: string) {
    super("invalid_argument", message);
  }
}

/** A message or batch exceeds a configured byte limit. */
export class TooLargeError extends KeyopError {
  constructor(message: string) {
    super("too_large", message);
  }
}

/** The disk is full: nothing partial was stored, retry once space is freed. */
export class DiskFullError extends KeyopError {
  constructor(message: string, cause?: unknown) {
    super("disk_full", message, { cause });
  }
}

/**
 * The channel's buffer is full and its policy is `reject`: nothing was
 * stored; the publisher keeps its data and tries again once links drain.
 */
export class BufferFullError extends KeyopError {
  constructor(message: string) {
    super("buffer_full", message);
  }
}

/** A request got no reply within its timeout. */
export class RequestTimeoutError extends KeyopError {
  constructor(message: string) {
    super("timeout", message);
  }
}

/** A request nobody could answer: no responder or consumer is attached to its channel, here or on a connected peer. */
export class NoRespondersError extends KeyopError {
  constructor(message: string) {
    super("no_responders", message);
  }
}

/** A request whose way to its responders is down (the link that carries the channel is not connected). */
export class RouteDownError extends KeyopError {
  constructor(message: string) {
    super("unreachable", message);
  }
}

/** A reply to an inbox no request waits on (it timed out, or was answered already). */
export class NoRequestError extends KeyopError {
  constructor(message: string) {
    super("no_request", message);
  }
}

/** Any other I/O failure on the log; nothing partial was stored. */
export class IoError extends KeyopError {
  constructor(message: string, cause?: unknown) {
    super("io_error", message, { cause });
  }
}

/**
 * The channel's disk failed and would not take even a fresh segment: the
 * channel refuses appends (nothing of them stored) while it retries with
 * backoff. Reads go on. Retry later.
 */
export class LogUnavailableError extends KeyopError {
  constructor(message: string, cause?: unknown) {
    super("log_unavailable", message, { cause });
  }
}

/** Another process holds the data directory. */
export class LockedError extends KeyopError {
  constructor(message: string) {
    super("locked", message);
  }
}

/** The messenger or log was closed (or is closing) and takes no more work. */
export class ClosedError extends KeyopError {
  constructor(message = "messenger is closed") {
    super("closed", message);
  }
}

/** An ack or delete named a subscriber that does not exist. */
export class UnknownSubscriberError extends KeyopError {
  constructor(message: string) {
    super("unknown_subscriber", message);
  }
}

/** A payload failed the decoder registered for its type. */
export class DecodeError extends KeyopError {
  constructor(message: string, cause?: unknown) {
    super("decode_failed", message, { cause });
  }
}

/** Configuration problems, all of them at once, each with its key path. */
export class ConfigError extends KeyopError {
  readonly problems: readonly string[];
  constructor(problems: readonly string[]) {
    super("invalid_config", `invalid configuration:\n  ${problems.join("\n  ")}`);
    this.problems = problems;
  }
}

/** Maps an OS error from a write or fsync to the typed error callers see. */
export function ioErrorFrom(err: unknown, what: string): KeyopError {
  if (err instanceof KeyopError) return err;
  const code = (err as { code?: string } | null)?.code;
  if (code === "ENOSPC" || code === "EDQUOT") return new DiskFullError(`${what}: disk full`, err);
  const msg = err instanceof Error ? err.message : String(err);
  return new IoError(`${what}: ${msg}`, err);
}

/** The HTTP request itself is malformed (bad JSON, bad query parameter). */
export class BadRequestError extends KeyopError {
  constructor(message: string) {
    super("bad_request", message);
  }
}

/** A channel named by an ack or delete does not exist. */
export class UnknownChannelError extends KeyopError {
  constructor(channel: string) {
    super("unknown_channel", `no channel "${channel}"`);
  }
}

/** Something else already serves the socket or port we were told to use. */
export class InUseError extends KeyopError {
  constructor(message: string) {
    super("in_use", message);
  }
}

/** The request cannot be served as asked while something else holds the resource (a subscriber consumed another way). */
export class ConflictError extends KeyopError {
  constructor(message: string) {
    super("conflict", message);
  }
}

/** A TLS peer failed verification (chain, validity, usage, name); its connection is closed. */
export class PeerRejectedError extends KeyopError {
  constructor(message: string) {
    super("peer_rejected", message);
  }
}

/** The connection to the hub dropped before the hub acknowledged: the message may or may not be stored. */
export class ConnectionLostError extends KeyopError {
  constructor(message: string) {
    super("conn_lost", message);
  }
}

/** Not connected and not reconnecting: nothing was sent. */
export class NotConnectedError extends KeyopError {
  constructor(message: string) {
    super("not_connected", message);
  }
}

/** The hub does not allow this peer to do that (publish outside its rules). */
export class ForbiddenError extends KeyopError {
  constructor(message: string) {
    super("forbidden", message);
  }
}

/** The caller's AbortSignal fired before the operation could start. */
export class AbortedError extends KeyopError {
  constructor(message: string) {
    super("aborted", message);
  }
}

/**
 * The storage engine a hub tier stores in (JetStream) cannot take writes now:
 * the cluster is unreachable or has no quorum. Nothing was acknowledged;
 * the sender keeps its data and tries again.
 */
export class EngineUnavailableError extends KeyopError {
  constructor(message: string, cause?: unknown) {
    super("unavailable", message, { cause });
  }
}
