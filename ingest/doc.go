// Package ingest records LLM token usage: the POST /v1/usage-events,
// POST /v1/usage-events/batch and GET /v1/usage-events/{id} endpoints,
// request validation, the idempotency contract, the exact overage split,
// and the one transaction that writes the usage logs, their report jobs
// and the stored response together. A batch is the same transaction with
// up to 1,000 events in it.
//
// The design behind it is in docs/ingest.md.
package ingest
