/**
 * keyop-messenger: the library entry point (README, "The library").
 *
 * Programs embedding keyop import from here; the binary's entry is main.ts.
 */
export { Messenger } from "./messenger/messenger.ts";
export type {
  PublishOptions,
  RequestOptions,
  PublishResult,
  BatchEntry,
  MessengerStats,
  ChannelStats,
  SubscriberStats,
  ChannelCounters,
  PayloadDecoder,
} from "./messenger/messenger.ts";
export type { MessengerConfig } from "./messenger/config.ts";
export { Subscription } from "./messenger/subscription.ts";
export type { Handler, SubscribeOptions } from "./messenger/subscription.ts";
export { RetryLater } from "./messenger/retry-later.ts";
export { EphemeralMessenger } from "./federation/ephemeral.ts";
export type { EphemeralConfig, EphemeralHandler, EphemeralPublishOptions, EphemeralPublishResult } from "./federation/ephemeral.ts";
export { withContext, currentContext } from "./messenger/context.ts";
export type { PublishContext } from "./messenger/context.ts";
export type { Message } from "./envelope/envelope.ts";
export { compilePattern, channelProblem } from "./envelope/names.ts";
export type { SyncMode } from "./store/channel-log.ts";
export type { StartFrom } from "./store/cursor-store.ts";
export { createLogger, silentLogger } from "./observability/logger.ts";
export type { Logger, LogLevel, LogFormat } from "./observability/logger.ts";
export * from "./errors.ts";
