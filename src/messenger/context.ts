/**
 * Publish context carried through async calls (AsyncLocalStorage).
 *
 * A handler runs inside the context of the message it handles, so that what
 * it publishes carries the same correlation id without passing it by hand.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import type { NewMessage } from "../envelope/build.ts";
import type { MessageMeta } from "../envelope/envelope.ts";

/** Fields stamped on publishes made inside the context. */
export interface PublishContext {
  serviceName?: string | undefined;
  correlationId?: string | undefined;
}

const storage = new AsyncLocalStorage<PublishContext>();

/**
 * Runs `fn` with `ctx` merged over the current context; publishes made in
 * `fn` (and anything it awaits) inherit the fields unless opts override them.
 */
export function withContext<T>(ctx: PublishContext, fn: () => T): T {
  const current = storage.getStore();
  const merged: PublishContext = { ...current };
  if (ctx.serviceName !== undefined) merged.serviceName = ctx.serviceName;
  if (ctx.correlationId !== undefined) merged.correlationId = ctx.correlationId;
  return storage.run(merged, fn);
}

/**
 * A new message with the labels it carries: from its own options, else the
 * context in force, else the publisher's default service name.
 */
export function labelledMessage(
  channel: string,
  type: string,
  payload: unknown,
  opts: (PublishContext & { meta?: MessageMeta | undefined }) | undefined,
  defaultServiceName: string | undefined,
): NewMessage {
  const ctx = storage.getStore();
  const m: NewMessage = { channel, type, payload, correlationId: correlationIdOf(opts, ctx), serviceName: serviceNameOf(opts, ctx, defaultServiceName) };
  if (opts?.meta) m.meta = opts.meta;
  return m;
}

/** The correlation id a publish carries: its own, else the context's. */
export function correlationIdOf(opts: PublishContext | undefined, ctx: PublishContext | undefined): string | undefined {
  return opts?.correlationId ?? ctx?.correlationId;
}

/** The service name a publish carries: its own, else the context's, else the publisher's default. */
export function serviceNameOf(opts: PublishContext | undefined, ctx: PublishContext | undefined, defaultServiceName: string | undefined): string | undefined {
  return opts?.serviceName ?? ctx?.serviceName ?? defaultServiceName;
}

/** The context in force here, if any. */
export function currentContext(): PublishContext | undefined {
  return storage.getStore();
}
