// Package webhooks receives Stripe webhooks (POST /v1/webhooks/stripe),
// stores each verified event once per (event id, receiving account) with
// its processing job in the same transaction, and applies the events one
// at a time in arrival order (Processor, queue "webhooks", one worker).
//
// Seen is not done: the store (the event's lock, then its lookup in every
// month's partition) makes a redelivery a no-op for storage, but only the
// row's processed_at says an event was applied. A redelivery of an event
// that is stored and not yet processed queues its job again (River skips
// it while one is live), so an event whose job was lost, discarded or
// cleaned up is still applied.
//
// API versions: events are verified with IgnoreAPIVersionMismatch. Stripe
// renders an event with the webhook endpoint's API version, which need not
// be the version stripe-go v79 is pinned to (2024-06-20); refusing the
// others would make Stripe retry them for three days and then drop them,
// losing subscription changes and deletions. So every event is stored with
// its api_version, and the processor decodes only the few fields it uses
// from the raw JSON (never stripe-go's typed objects), reading the ones
// that moved between versions from both places (a subscription's current
// period is on the subscription before 2025-03-31 and on its items since).
package webhooks

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stripe/stripe-go/v79/webhook"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/dberr"
	"github.com/overage-billing/overage/internal/httpx"
	"github.com/overage-billing/overage/outbox"
)

// MaxBodyBytes is the largest webhook body accepted; Stripe's events are
// far smaller.
const MaxBodyBytes = 1 << 20

// Tolerance is how old a signature's timestamp may be.
const Tolerance = 300 * time.Second

// PlatformAccount is the account scope of events that carry no `account`
// (events of our own Stripe account rather than of a Connect account).
const PlatformAccount = "platform"

// HandlerConfig wires the handler.
type HandlerConfig struct {
	Pool *pgxpool.Pool
	// River inserts processing jobs; it may be insert-only.
	River *river.Client[pgx.Tx]
	// Secret is STRIPE_WEBHOOK_SECRET. Empty refuses every delivery with
	// 503: Stripe keeps retrying for up to three days, so events sent
	// before the secret is configured are still received afterwards.
	Secret string
	Logger *slog.Logger
}

// Handler serves POST /v1/webhooks/stripe.
type Handler struct {
	pool   *pgxpool.Pool
	river  *river.Client[pgx.Tx]
	secret string
	logger *slog.Logger
	// beforeInsert, set by a test, runs after a delivery found no stored
	// event and before it inserts: where a second delivery of the same
	// event would race it but for the event lock.
	beforeInsert func(StoredEvent)
}

// NewHandler returns the webhook handler.
func NewHandler(cfg HandlerConfig) *Handler {
	l := cfg.Logger
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return &Handler{pool: cfg.Pool, river: cfg.River, secret: cfg.Secret, logger: l}
}

// Routes mounts the endpoint on r.
func (h *Handler) Routes(r chi.Router) {
	r.Post("/v1/webhooks/stripe", h.receive)
}

// Result is what Store did with one delivery.
type Result struct {
	Seq       int64
	Duplicate bool
	// Processed: a duplicate of an event already applied.
	Processed bool
	// Requeued: a duplicate of an unprocessed event got a new job.
	Requeued bool
}

func (h *Handler) receive(w http.ResponseWriter, r *http.Request) {
	if h.secret == "" {
		httpx.Error(w, r, h.logger, &overage.Error{Code: overage.EUNAVAILABLE, Type: "webhooks-disabled",
			Message: "STRIPE_WEBHOOK_SECRET is not configured: Stripe webhooks are refused", RetryAfter: time.Minute})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			httpx.Error(w, r, h.logger, overage.Errorf(overage.ETOOLARGE, "payload-too-large", "a webhook body may be at most %d bytes", MaxBodyBytes))
			return
		}
		httpx.Error(w, r, h.logger, overage.Errorf(overage.EMALFORMED, "malformed-request", "could not read the body: %v", err))
		return
	}
	ev, err := webhook.ConstructEventWithOptions(body, r.Header.Get("Stripe-Signature"), h.secret,
		webhook.ConstructEventOptions{Tolerance: Tolerance, IgnoreAPIVersionMismatch: true})
	if err != nil {
		h.logger.WarnContext(r.Context(), "stripe webhook refused", "err", err)
		httpx.Error(w, r, h.logger, overage.Errorf(overage.EMALFORMED, "invalid-signature",
			"the Stripe-Signature header does not verify this body with STRIPE_WEBHOOK_SECRET within %s: %v", Tolerance, err))
		return
	}
	if ev.ID == "" || ev.Type == "" {
		httpx.Error(w, r, h.logger, overage.Errorf(overage.EMALFORMED, "malformed-request", "the event has no id or type"))
		return
	}
	account := ev.Account
	if account == "" {
		account = PlatformAccount
	}
	res, err := h.Store(r.Context(), StoredEvent{
		ID: ev.ID, Account: account, Type: string(ev.Type), APIVersion: ev.APIVersion,
		Livemode: ev.Livemode, Created: ev.Created, Payload: body,
	})
	if dberr.IsDataException(err) {
		httpx.Error(w, r, h.logger, overage.Errorf(overage.EMALFORMED, "malformed-request",
			"the event holds a value that cannot be stored (a NUL character or a lone surrogate): %v", err))
		return
	}
	if err != nil {
		httpx.Error(w, r, h.logger, dberr.Classify(err, "the database is unreachable; nothing was stored, Stripe will retry"))
		return
	}
	h.logger.InfoContext(r.Context(), "stripe webhook received", "event_id", ev.ID, "account", account, "type", ev.Type,
		"api_version", ev.APIVersion, "seq", res.Seq, "duplicate", res.Duplicate, "requeued", res.Requeued)
	httpx.JSON(w, http.StatusOK, map[string]any{"received": true, "duplicate": res.Duplicate})
}

// StoredEvent is a verified event to store.
type StoredEvent struct {
	ID, Account, Type, APIVersion string
	Livemode                      bool
	Created                       int64 // Unix seconds
	Payload                       []byte
}

// Store records a verified event and queues its processing job in one
// transaction. A duplicate stores nothing; when it is not processed yet, its
// job is queued again (a no-op while a live one exists).
//
// The table is partitioned by receipt month and each month's unique index
// referees only its month, so the store itself is the referee across
// months: it takes a transaction lock on (account, event id) before it
// looks the event up, so of two deliveries of one event the second waits
// for the first to commit and then finds its row, in whichever month it
// was stored. The month's unique index stays the backstop (ON CONFLICT DO
// NOTHING, then the lookup) against a writer that does not take the lock.
func (h *Handler) Store(ctx context.Context, e StoredEvent) (Result, error) {
	var res Result
	err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, eventLock(e.Account, e.ID)); err != nil {
			return fmt.Errorf("lock webhook event %s: %w", e.ID, err)
		}
		found, err := h.stored(ctx, tx, e, &res)
		if err != nil || found {
			return err
		}
		if h.beforeInsert != nil {
			h.beforeInsert(e)
		}
		var created *time.Time
		if e.Created > 0 {
			c := time.Unix(e.Created, 0).UTC()
			created = &c
		}
		err = tx.QueryRow(ctx, `INSERT INTO stripe_webhook_events
				(event_id, account, type, api_version, livemode, event_created, payload)
			VALUES ($1, $2, $3, nullif($4, ''), $5, $6, $7)
			ON CONFLICT DO NOTHING RETURNING seq`,
			e.ID, e.Account, e.Type, e.APIVersion, e.Livemode, created, string(e.Payload)).Scan(&res.Seq)
		if errors.Is(err, pgx.ErrNoRows) {
			// Stored meanwhile by a writer without the lock: a duplicate.
			if found, err = h.stored(ctx, tx, e, &res); err == nil && !found {
				err = fmt.Errorf("webhook event %s conflicts with a row the lookup does not find", e.ID)
			}
			return err
		}
		if err != nil {
			return fmt.Errorf("store webhook event %s: %w", e.ID, err)
		}
		return h.queue(ctx, tx, e, &res)
	})
	return res, err
}

// stored looks e up in every partition (each one's unique index) and, when
// it is there, fills res as a duplicate and queues its job again unless it
// is processed.
func (h *Handler) stored(ctx context.Context, tx pgx.Tx, e StoredEvent, res *Result) (bool, error) {
	// The row lock orders us after a processor applying it right now.
	var processedAt *time.Time
	err := tx.QueryRow(ctx, `SELECT seq, processed_at FROM stripe_webhook_events
		WHERE event_id = $1 AND account = $2 FOR UPDATE`, e.ID, e.Account).Scan(&res.Seq, &processedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read stored webhook event %s: %w", e.ID, err)
	}
	res.Duplicate = true
	if processedAt != nil {
		res.Processed = true
		return true, nil
	}
	return true, h.queue(ctx, tx, e, res)
}

func (h *Handler) queue(ctx context.Context, tx pgx.Tx, e StoredEvent, res *Result) error {
	ins, err := h.river.InsertTx(ctx, tx, outbox.ProcessWebhookArgs{Seq: res.Seq}, nil)
	if err != nil {
		return fmt.Errorf("queue webhook event %s: %w", e.ID, err)
	}
	res.Requeued = res.Duplicate && !ins.UniqueSkippedAsDuplicate
	return nil
}

// eventLock maps (account, event id) to the 64-bit advisory lock id of the
// event's store. A collision between two events (odds 2^-64) only makes
// one delivery wait for the other.
func eventLock(account, id string) int64 {
	h := sha256.New()
	h.Write([]byte("stripe-event\x00"))
	h.Write([]byte(account))
	h.Write([]byte{0})
	h.Write([]byte(id))
	return int64(binary.BigEndian.Uint64(h.Sum(nil)))
}
