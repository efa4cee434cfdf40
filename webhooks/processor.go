package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/overage-billing/overage/outbox"
	"github.com/overage-billing/overage/tenants"
)

// SuspendedReason is the billing message of the reports of a tenant whose
// Stripe customer was deleted.
const SuspendedReason = "Stripe customer deleted; tenant suspended"

// orderLock is the transaction-scoped advisory lock every event
// application takes first ("webhook" as a big-endian integer), so events
// are applied one at a time in seq order even when several `work`
// processes each run their one webhook worker.
const orderLock int64 = 0x776562686f6f6b

// maxPerJob bounds how many events one job applies; a job that stops
// short of its own event is retried at once (snoozed).
const maxPerJob = 1000

// Processor applies stored Stripe events, oldest unprocessed first. A job
// for event N applies every unprocessed event up to and including N, in seq
// order, whichever job was fetched first — so retries, restarts and lost
// jobs never reorder them. Each event's effect and its processed_at commit
// together.
type Processor struct {
	river.WorkerDefaults[outbox.ProcessWebhookArgs]
	pool   *pgxpool.Pool
	logger *slog.Logger
}

// NewProcessor returns the worker of queue outbox.QueueWebhooks, which
// must run with MaxWorkers 1.
func NewProcessor(pool *pgxpool.Pool, logger *slog.Logger) *Processor {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Processor{pool: pool, logger: logger}
}

// Timeout implements river.Worker.
func (p *Processor) Timeout(*river.Job[outbox.ProcessWebhookArgs]) time.Duration {
	return 5 * time.Minute
}

// Work implements river.Worker.
func (p *Processor) Work(ctx context.Context, job *river.Job[outbox.ProcessWebhookArgs]) error {
	for range maxPerJob {
		seq, err := p.ProcessNext(ctx, job.Args.Seq)
		if err != nil {
			return err
		}
		if seq == 0 { // nothing unprocessed up to our event: done
			return nil
		}
	}
	return river.JobSnooze(time.Millisecond)
}

// ProcessNext applies the oldest unprocessed event whose seq is at most
// upTo and returns its seq, or 0 when there is none.
func (p *Processor) ProcessNext(ctx context.Context, upTo int64) (int64, error) {
	var seq int64
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, orderLock); err != nil {
			return fmt.Errorf("take webhook order lock: %w", err)
		}
		var ev event
		// Across the partitions: a merge, by seq, of each one's index of
		// unprocessed events (docs/plans.md, "Stripe webhook events").
		err := tx.QueryRow(ctx, `SELECT seq, received_at, event_id, account, type, coalesce(event_created, received_at), payload
			FROM stripe_webhook_events WHERE processed_at IS NULL AND seq <= $1
			ORDER BY seq LIMIT 1 FOR UPDATE`, upTo).
			Scan(&ev.seq, &ev.received, &ev.id, &ev.account, &ev.typ, &ev.created, &ev.payload)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read next webhook event: %w", err)
		}
		outcome, err := p.apply(ctx, tx, &ev)
		if err != nil {
			return err
		}
		// received_at picks the partition; processed_at IS NULL lets its
		// index of unprocessed events find the row (seq has no other
		// index in a month's partition).
		tag, err := tx.Exec(ctx, `UPDATE stripe_webhook_events SET processed_at = clock_timestamp(), process_outcome = $3
			WHERE seq = $1 AND received_at = $2 AND processed_at IS NULL`,
			ev.seq, ev.received, outcome)
		if err != nil {
			return fmt.Errorf("mark webhook event %s processed: %w", ev.id, err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("mark webhook event %s processed: %d rows marked, want 1", ev.id, tag.RowsAffected())
		}
		p.logger.InfoContext(ctx, "stripe webhook processed", "seq", ev.seq, "event_id", ev.id, "account", ev.account, "type", ev.typ, "outcome", outcome)
		seq = ev.seq
		return nil
	})
	return seq, err
}

type event struct {
	seq      int64
	received time.Time
	id       string
	account  string
	typ      string
	created  time.Time
	payload  []byte
}

// permanent marks an event that can never be applied (its payload lacks
// what its type needs): it is acknowledged with the reason as its outcome
// rather than blocking every later event behind it forever.
type permanent struct{ msg string }

func (e permanent) Error() string { return e.msg }

// apply runs the event's effect in tx and returns its outcome. A database
// error rolls back and retries; a permanent one is recorded as the outcome.
func (p *Processor) apply(ctx context.Context, tx pgx.Tx, ev *event) (string, error) {
	var env struct {
		Data struct {
			Object json.RawMessage `json:"object"`
		} `json:"data"`
		RelatedObject json.RawMessage `json:"related_object"`
	}
	if err := json.Unmarshal(ev.payload, &env); err != nil {
		return "error: payload is not an event: " + err.Error(), nil
	}
	var out string
	var err error
	switch ev.typ {
	case "customer.subscription.created", "customer.subscription.updated", "customer.subscription.deleted":
		out, err = p.subscription(ctx, tx, ev, env.Data.Object)
	case "customer.deleted":
		out, err = p.customerDeleted(ctx, tx, ev, env.Data.Object)
	case "invoice.finalized":
		out, err = p.invoiceFinalized(ctx, tx, ev, env.Data.Object)
	case "billing.meter.error_report_triggered", "v1.billing.meter.error_report_triggered":
		out, err = p.meterErrorReport(ctx, tx, ev)
	default:
		return "ignored", nil
	}
	var perm permanent
	if errors.As(err, &perm) {
		p.logger.WarnContext(ctx, "stripe webhook cannot be applied; acknowledged", "event_id", ev.id, "type", ev.typ, "reason", perm.msg)
		return "error: " + perm.msg, nil
	}
	return out, err
}

// subscriptionObject holds the fields read from a subscription in any API
// version: the current period is on the subscription before 2025-03-31 and
// on each item since.
type subscriptionObject struct {
	ID                 string `json:"id"`
	Customer           any    `json:"customer"` // an id, or an expanded object
	Status             string `json:"status"`
	CurrentPeriodStart int64  `json:"current_period_start"`
	CurrentPeriodEnd   int64  `json:"current_period_end"`
	EndedAt            int64  `json:"ended_at"`
	Items              struct {
		Data []struct {
			CurrentPeriodStart int64 `json:"current_period_start"`
			CurrentPeriodEnd   int64 `json:"current_period_end"`
		} `json:"data"`
	} `json:"items"`
}

func customerID(v any) string {
	switch c := v.(type) {
	case string:
		return c
	case map[string]any:
		if id, ok := c["id"].(string); ok {
			return id
		}
	}
	return ""
}

func (p *Processor) subscription(ctx context.Context, tx pgx.Tx, ev *event, obj json.RawMessage) (string, error) {
	var s subscriptionObject
	if err := json.Unmarshal(obj, &s); err != nil {
		return "", permanent{"subscription object: " + err.Error()}
	}
	cus := customerID(s.Customer)
	start, end := s.CurrentPeriodStart, s.CurrentPeriodEnd
	if start == 0 && len(s.Items.Data) > 0 {
		start, end = s.Items.Data[0].CurrentPeriodStart, s.Items.Data[0].CurrentPeriodEnd
	}
	if s.ID == "" || cus == "" || s.Status == "" || start == 0 || end <= start {
		return "", permanent{"subscription without id, customer, status or current period"}
	}
	if ev.typ == "customer.subscription.deleted" && s.EndedAt > start && s.EndedAt < end {
		end = s.EndedAt // the period the allowance follows ended with it
	}
	n, err := tenants.ApplySubscription(ctx, tx, tenants.SubscriptionChange{Customer: cus, ID: s.ID, Status: s.Status,
		Start: time.Unix(start, 0).UTC(), End: time.Unix(end, 0).UTC(), EventCreated: ev.created})
	if err != nil {
		return "", err
	}
	if n == 0 {
		n, err := tenants.CountOfCustomer(ctx, tx, cus)
		if err != nil {
			return "", err
		}
		if n == 0 {
			return "no tenant", nil
		}
		return "stale: a newer event already applied", nil
	}
	return "applied", nil
}

func (p *Processor) customerDeleted(ctx context.Context, tx pgx.Tx, ev *event, obj json.RawMessage) (string, error) {
	var c struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(obj, &c); err != nil || c.ID == "" {
		return "", permanent{"customer object without id"}
	}
	n, err := tenants.SuspendCustomer(ctx, tx, c.ID, ev.created, SuspendedReason)
	if err != nil {
		return "", err
	}
	if n == 0 {
		return "no tenant", nil
	}
	p.logger.WarnContext(ctx, "tenant suspended: its Stripe customer was deleted", "stripe_customer_id", c.ID, "event_id", ev.id)
	return "applied", nil
}

// invoiceObject holds the fields read from an invoice in any API version:
// its subscription is top-level before 2025-03-31 and under
// parent.subscription_details since.
type invoiceObject struct {
	ID            string `json:"id"`
	Customer      any    `json:"customer"`
	Subscription  any    `json:"subscription"`
	BillingReason string `json:"billing_reason"`
	PeriodStart   int64  `json:"period_start"`
	PeriodEnd     int64  `json:"period_end"`
	Parent        struct {
		SubscriptionDetails struct {
			Subscription any `json:"subscription"`
		} `json:"subscription_details"`
	} `json:"parent"`
}

// invoiceFinalized closes the tenant's periods an invoice of its
// subscription's cycle billed: its usage period ends at period_end (for a
// subscription invoice Stripe looks back one period), so every allowance
// period that began before it is closed from now on, even inside
// PERIOD_CLOSE_GRACE (closed_periods, read by usagelog.PeriodClosedSQL).
// Other invoices (the first of a subscription, threshold, manual, one-off)
// close nothing: their period does not end a billing period.
func (p *Processor) invoiceFinalized(ctx context.Context, tx pgx.Tx, ev *event, obj json.RawMessage) (string, error) {
	var inv invoiceObject
	if err := json.Unmarshal(obj, &inv); err != nil {
		return "", permanent{"invoice object: " + err.Error()}
	}
	cus, sub := customerID(inv.Customer), customerID(inv.Subscription)
	if sub == "" {
		sub = customerID(inv.Parent.SubscriptionDetails.Subscription)
	}
	if inv.ID == "" || cus == "" {
		return "", permanent{"invoice without id or customer"}
	}
	if sub == "" || inv.BillingReason != "subscription_cycle" {
		return "ignored: not a subscription cycle's invoice", nil
	}
	start, end := time.Unix(inv.PeriodStart, 0).UTC(), time.Unix(inv.PeriodEnd, 0).UTC()
	if inv.PeriodEnd <= inv.PeriodStart || end.After(ev.created) {
		return "ignored: its period has not ended", nil
	}
	n, err := tenants.ClosePeriods(ctx, tx, cus, inv.ID, start, end, ev.created)
	if err != nil {
		return "", err
	}
	if n == 0 {
		n, err := tenants.CountOfCustomer(ctx, tx, cus)
		if err != nil {
			return "", err
		}
		if n == 0 {
			return "no tenant", nil
		}
		return "already closed", nil
	}
	return "applied", nil
}

// meterErrorReport records the report for finance. The shape differs
// between the snapshot event and the v2 thin event, so the whole payload is
// kept and the common fields are read where present.
func (p *Processor) meterErrorReport(ctx context.Context, tx pgx.Tx, ev *event) (string, error) {
	var r struct {
		Data struct {
			Object struct {
				ID string `json:"id"`
			} `json:"object"`
			Reason struct {
				ErrorCount int64 `json:"error_count"`
				ErrorTypes []struct {
					Code string `json:"code"`
				} `json:"error_types"`
			} `json:"reason"`
			ValidationEnd string `json:"validation_end"`
			DeveloperMsg  string `json:"developer_message_summary"`
		} `json:"data"`
		RelatedObject struct {
			ID string `json:"id"`
		} `json:"related_object"`
	}
	_ = json.Unmarshal(ev.payload, &r) // best effort: the payload is kept whole
	meter := r.RelatedObject.ID
	if meter == "" {
		meter = r.Data.Object.ID
	}
	if _, err := tx.Exec(ctx, `INSERT INTO meter_error_reports
			(event_seq, event_id, account, meter_id, summary, error_count, reported_at, details)
		VALUES ($1, $2, $3, nullif($4, ''), nullif($5, ''), nullif($6, 0), $7, $8)
		ON CONFLICT (event_id, account) DO NOTHING`,
		ev.seq, ev.id, ev.account, meter, r.Data.DeveloperMsg, r.Data.Reason.ErrorCount, ev.created, string(ev.payload)); err != nil {
		return "", fmt.Errorf("record meter error report %s: %w", ev.id, err)
	}
	return "recorded", nil
}
