// Package ingest records LLM token usage: the POST /v1/usage-events,
// POST /v1/usage-events/batch and GET /v1/usage-events/{id} endpoints,
// request validation, the idempotency contract, the exact overage split,
// and the one transaction that writes the usage logs, their report jobs
// and the stored response together. A batch is the same transaction with
// up to 1,000 events in it; concurrent single events of one tenant share
// one too, each under its own key and stored answer (group.go).
//
// The design behind it is in docs/ingest.md.
package ingest
