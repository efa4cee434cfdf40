// Package ingest records LLM token usage: the POST /v1/usage-events and
// GET /v1/usage-events/{id} endpoints, request validation, the idempotency
// contract, the exact overage split, and the one transaction that writes
// the usage log, its River report job and the stored response together.
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
//  3. A request_id the tenant already recorded under another key answers
//     200 with that log and "duplicate": true; nothing new is billed.
//  4. Otherwise the allowance counter, the usage log, the River job and the
//     stored response (idempotency_keys) are written, then committed.
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
package ingest
