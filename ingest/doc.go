// Package ingest records LLM token usage: the POST /v1/usage-events,
// POST /v1/usage-events/batch and GET /v1/usage-events/{id} endpoints,
// request validation, the idempotency contract, the exact overage split,
// and the one transaction that writes the usage logs, their report jobs
// and the stored response together. A batch is the same transaction with
// up to 1,000 events in it.
//
// # Idempotency design
//
// A request is checked in this order: authenticate, validate, fingerprint
// (SHA-256 over method, path and the RFC 8785 canonical body), then the key.
// The key is handled in ONE transaction per request (design "b"):
//
//  1. pg_try_advisory_xact_lock on (tenant, key). Not acquired means another
//     request with this key is executing right now: 409 in progress, with
//     Retry-After, unless a committed record appeared meanwhile (then it is
//     replayed or reported as key reuse).
//  2. Read the committed record for (tenant, key). A live one is replayed
//     byte for byte, or refused as key reuse when the fingerprint differs.
//     An expired one is deleted: the key starts a new request.
//  3. An event whose request_id the tenant already recorded answers with
//     that log and "duplicate": true (a single event: 200); nothing new is
//     billed.
//  4. Otherwise the allowance totals, the usage logs, the report jobs
//     (outbox.InsertReportsTx, once per transaction) and the stored
//     response are written, then committed.
//
// Steps 1 to 3 and BEGIN travel in one pipeline, the writes and COMMIT in
// another, so a new event costs three round trips: the reads, River's job
// insert, the writes (four while the tenant's allowance is not used up;
// see below).
//
// # The overage split without a per-tenant bottleneck
//
// An event's overage is the part of it above the allowance given the
// tenant's running total for its period: max(0, after - allowance) -
// max(0, before - allowance) per dimension, which splits an event that
// crosses the allowance exactly. That needs the events of a period in an
// order only while the total is below the allowance. The transaction
// reads the period's committed total; if it had reached the allowance in
// both dimensions (always, for a tenant without allowance), totals only
// grow, so the event's overage is all its tokens in any order: no lock.
// Otherwise it takes an advisory lock on (tenant, period) and reads the
// total again in a statement that starts after the lock is granted, so
// such events are ordered and each sees every earlier one. An unordered
// transaction still in flight cannot be missed: it saw a committed total
// at or above the allowance, which the later read sees too.
//
// The totals (allowance_usage) and the finance counters (billing_counters)
// are spread over slot rows summed on read, and each transaction of a
// process writes a slot no other holds (slots.go), so events of one tenant
// do not wait for each other's commit. migrations/0007_ingest_slots.sql
// gives the lock order that keeps this free of deadlocks.
//
// Why this design and not a committed IN_PROGRESS claim (design "a"): it
// commits once per event instead of twice, and no claim can outlive a
// crash — the advisory lock dies with the transaction or the connection,
// so there is no lock timeout to tune and no takeover protocol to get
// wrong. The primary key on (tenant, key) and the unique index on
// (tenant, request_id) remain the referees: should two transactions ever
// race past the reads, the loser's unique violation rolls it back whole and
// it is retried, now finding the winner's record.
//
// The price of design "b": the fingerprint of a request still in flight is
// not visible to others (nothing is committed yet), so a different body
// sent while the first is executing gets 409 in progress, and its retry
// gets 409 key reuse once the first has committed. Against a committed
// record, key reuse is always reported before anything else.
//
// What is stored and replayed: 2xx outcomes and the deterministic duplicate
// response. Errors (4xx from validation or authentication, 5xx, 503 when
// the database is unreachable) are never stored: nothing was committed, so
// the same key may be retried.
//
// Expiry uses the database clock (now() in SQL), never the app server's.
//
// # Stream checkpoints and corrections
//
// A checkpoint of a streaming response (stream.go) and a correction
// (correction.go) each run one ordinary transaction under the same key
// protocol (claimKey: the key's advisory lock, the stored answer replayed or
// refused). Their referee is a row lock taken before anything is decided:
// the stream's usage_streams row, the corrected log's row. Each records a
// usage log holding a token difference (an increase, or a correction's
// possibly negative difference) whose overage is the change of its
// period's overage, computed under the period's advisory lock with the
// period's total rows locked (deltaLog). Their counter rows are those of a
// leased slot, so they never wait on a report worker's.
package ingest
