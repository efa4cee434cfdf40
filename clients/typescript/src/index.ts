export * from "./client.js";
export * from "./errors.js";
export { fromAnthropic, fromOpenAI } from "./convert.js";
export { DEFAULT_TOLERANCE_SECONDS, signWebhook, verifyWebhook, type VerifyWebhookOptions } from "./webhook.js";
