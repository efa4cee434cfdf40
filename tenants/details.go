package tenants

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/internal/page"
)

// Details is what an operator sees of a tenant: its allowance, Stripe
// customer, API keys (never the keys themselves), subscription period and
// suspension. `overage tenant show --json` and GET /v1/tenants/{id} print
// it alike.
type Details struct {
	overage.Tenant
	SuspendedAt     *time.Time    `json:"suspended_at"`
	SuspendedReason *string       `json:"suspended_reason"`
	Subscription    *Subscription `json:"subscription"`
	APIKeys         []APIKey      `json:"api_keys"`
	// AlertURL and AlertAt are where threshold events go and at which
	// percentages of each meter's allowance (docs/alerts.md).
	AlertURL *string `json:"alert_url"`
	AlertAt  []int   `json:"alert_at"`
	// AlertSecret is the endpoint's signing secret: only in the answer of
	// the update that set the URL, never again.
	AlertSecret string `json:"alert_secret,omitempty"`
}

// Subscription is the tenant's Stripe subscription as the webhooks last
// told it: its current period bounds the allowance.
type Subscription struct {
	ID                 string    `json:"stripe_subscription_id"`
	Status             string    `json:"status"`
	CurrentPeriodStart time.Time `json:"current_period_start"`
	CurrentPeriodEnd   time.Time `json:"current_period_end"`
}

// List is every tenant, oldest first, or one page of them.
type List struct {
	Tenants []Details `json:"tenants"`
	// NextCursor continues the list (?cursor=) when more tenants may
	// follow; null on the last page.
	NextCursor *string `json:"next_cursor"`
}

// listKey is the cursor of a page of tenants: the last one's place in
// the order (created_at, id).
type listKey struct {
	CreatedAt time.Time `json:"c"`
	ID        uuid.UUID `json:"i"`
}

// detailsQuery reads tenants with their newest subscription and their keys
// in one statement; $1 NULL reads them all, from after ($2, $3) in the
// order, at most $4 of them (NULL: no limit).
const detailsQuery = `
	SELECT t.id, t.name, t.stripe_customer_id, t.included_input_tokens, t.included_output_tokens, t.included_meters, t.created_at,
	       t.suspended_at, t.suspended_reason, t.alert_url, coalesce(t.alert_thresholds, '{}')::int[],
	       s.stripe_subscription_id, s.status, s.current_period_start, s.current_period_end,
	       coalesce((SELECT json_agg(json_build_object('id', k.id, 'prefix', k.key_prefix,
	                        'created_at', k.created_at, 'revoked_at', k.revoked_at) ORDER BY k.created_at, k.id)
	                 FROM api_keys k WHERE k.tenant_id = t.id), '[]')
	FROM tenants t
	LEFT JOIN LATERAL (SELECT * FROM tenant_subscriptions s WHERE s.tenant_id = t.id
	                   ORDER BY s.current_period_end DESC LIMIT 1) s ON true
	WHERE ($1::uuid IS NULL OR t.id = $1)
	  AND ($2::timestamptz IS NULL OR (t.created_at, t.id) > ($2, $3::uuid))
	ORDER BY t.created_at, t.id
	LIMIT $4`

// Show returns one tenant's details.
func (s *Store) Show(ctx context.Context, id uuid.UUID) (*Details, error) {
	l, err := s.details(ctx, &id, nil, nil)
	if err != nil {
		return nil, err
	}
	if len(l) == 0 {
		return nil, errTenantNotFound(id)
	}
	return &l[0], nil
}

// List returns every tenant's details.
func (s *Store) List(ctx context.Context) (*List, error) {
	l, err := s.details(ctx, nil, nil, nil)
	if err != nil {
		return nil, err
	}
	return &List{Tenants: l}, nil
}

// ListPage returns one page of the tenants' details, oldest first.
func (s *Store) ListPage(ctx context.Context, p page.Params) (*List, error) {
	var after *listKey
	if p.HasCursor() {
		after = &listKey{}
		if err := p.Cursor(after); err != nil {
			return nil, err
		}
	}
	limit := p.Limit + 1 // one more says whether another page follows
	l, err := s.details(ctx, nil, after, &limit)
	if err != nil {
		return nil, err
	}
	more := len(l) > p.Limit
	if more {
		l = l[:p.Limit]
	}
	out := &List{Tenants: l}
	if more {
		last := l[len(l)-1]
		out.NextCursor = page.Next(true, listKey{CreatedAt: last.CreatedAt, ID: last.ID})
	}
	return out, nil
}

func (s *Store) details(ctx context.Context, id *uuid.UUID, after *listKey, limit *int) ([]Details, error) {
	var afterAt *time.Time
	var afterID *uuid.UUID
	if after != nil {
		afterAt, afterID = &after.CreatedAt, &after.ID
	}
	rows, err := s.pool.Query(ctx, detailsQuery, id, afterAt, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("read tenants: %w", err)
	}
	out := []Details{}
	for rows.Next() {
		var d Details
		var subID, subStatus *string
		var subStart, subEnd *time.Time
		var extra []byte
		if err := rows.Scan(&d.ID, &d.Name, &d.StripeCustomerID, &d.IncludedInputTokens, &d.IncludedOutputTokens, &extra, &d.CreatedAt,
			&d.SuspendedAt, &d.SuspendedReason, &d.AlertURL, &d.AlertAt, &subID, &subStatus, &subStart, &subEnd, &d.APIKeys); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read tenants: %w", err)
		}
		var err error
		if d.Included, err = included(d.IncludedInputTokens, d.IncludedOutputTokens, extra); err != nil {
			rows.Close()
			return nil, err
		}
		if subID != nil {
			d.Subscription = &Subscription{ID: *subID, Status: *subStatus, CurrentPeriodStart: *subStart, CurrentPeriodEnd: *subEnd}
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read tenants: %w", err)
	}
	return out, nil
}

// UpdateParams changes a tenant; a nil field is left as it is.
type UpdateParams struct {
	Name                 *string `json:"name"`
	StripeCustomerID     *string `json:"stripe_customer_id"`
	IncludedInputTokens  *int64  `json:"included_input_tokens"`
	IncludedOutputTokens *int64  `json:"included_output_tokens"`
	// Included changes the allowances of the meters it names and no
	// other; 0 is no allowance. included.input and included.output are
	// the two fields above (both given, they must agree).
	Included map[string]int64 `json:"included"`
	// AlertURL sets the alert endpoint (a new signing secret is issued and
	// shown once); "" removes it and its secret. AlertAt sets the
	// thresholds, percentages 1 to 100; [] removes them.
	AlertURL *string `json:"alert_url"`
	AlertAt  *[]int  `json:"alert_at"`
}

// Empty reports whether p names nothing to change.
func (p UpdateParams) Empty() bool {
	return p.Name == nil && p.StripeCustomerID == nil && p.IncludedInputTokens == nil && p.IncludedOutputTokens == nil &&
		len(p.Included) == 0 && p.AlertURL == nil && p.AlertAt == nil
}

// Validate reports every problem with p at once.
func (p UpdateParams) Validate() error {
	_, _, err := p.allowances()
	return err
}

// allowances validates p and returns the default meters' new allowances
// (nil: unchanged).
func (p UpdateParams) allowances() (in, out *int64, err error) {
	var fields []overage.FieldError
	if p.Empty() {
		fields = append(fields, overage.FieldError{Field: "body", Detail: "names nothing to change"})
	}
	if p.Name != nil && strings.TrimSpace(*p.Name) == "" {
		fields = append(fields, overage.FieldError{Field: "name", Detail: "must not be empty"})
	} else if p.Name != nil && strings.ContainsRune(*p.Name, 0) {
		fields = append(fields, overage.FieldError{Field: "name", Detail: "must not hold a NUL character"})
	}
	if p.StripeCustomerID != nil {
		fields = append(fields, validateCustomer(*p.StripeCustomerID)...)
	}
	var oldIn, oldOut int64
	if p.IncludedInputTokens != nil {
		oldIn = *p.IncludedInputTokens
	}
	if p.IncludedOutputTokens != nil {
		oldOut = *p.IncludedOutputTokens
	}
	fields = append(fields, validateAllowance(oldIn, oldOut)...)
	fields = append(fields, validateIncluded(p.Included)...)
	fields = append(fields, alias(p.Included, overage.MeterInput, "included_input_tokens", p.IncludedInputTokens)...)
	fields = append(fields, alias(p.Included, overage.MeterOutput, "included_output_tokens", p.IncludedOutputTokens)...)
	if p.AlertURL != nil && *p.AlertURL != "" {
		if u, err := url.Parse(*p.AlertURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || len(*p.AlertURL) > 2048 {
			fields = append(fields, overage.FieldError{Field: "alert_url", Detail: "must be an absolute http or https URL (at most 2048 characters), or empty to remove it"})
		}
	}
	if p.AlertAt != nil {
		seen := map[int]bool{}
		for _, v := range *p.AlertAt {
			if v < 1 || v > 100 || seen[v] {
				fields = append(fields, overage.FieldError{Field: "alert_at", Detail: "must be distinct whole percentages from 1 to 100"})
				break
			}
			seen[v] = true
		}
		if len(*p.AlertAt) > 10 {
			fields = append(fields, overage.FieldError{Field: "alert_at", Detail: "must hold at most 10 thresholds"})
		}
	}
	if len(fields) > 0 {
		return nil, nil, overage.Invalid(fields, "invalid tenant update")
	}
	pick := func(key string, old *int64) *int64 {
		if n, ok := p.Included[key]; ok {
			return &n
		}
		return old
	}
	return pick(overage.MeterInput, p.IncludedInputTokens), pick(overage.MeterOutput, p.IncludedOutputTokens), nil
}

// Update changes a tenant and returns its details. Ingest reads the
// allowance when it records each event, so a new allowance applies to
// usage recorded after the change; no recorded log is recomputed. A new
// Stripe customer for a suspended tenant lifts the suspension, once Stripe
// confirms it knows the customer (see suspension.go).
//
// "included" replaces the allowances of the meters it names only: the
// keys it sets to 0 leave included_meters, the others are set, and every
// other key stays as it was.
func (s *Store) Update(ctx context.Context, id uuid.UUID, p UpdateParams) (*Details, error) {
	in, out, err := p.allowances()
	if err != nil {
		return nil, err
	}
	// The secret is issued with the URL: $8 says whether the URL changes,
	// $9 is the new secret (NULL when the URL is removed).
	var secret *string
	if p.AlertURL != nil && *p.AlertURL != "" {
		sec, err := NewAlertSecret()
		if err != nil {
			return nil, fmt.Errorf("alert signing secret: %w", err)
		}
		secret = &sec
	}
	var thresholds []int16
	if p.AlertAt != nil {
		thresholds = make([]int16, len(*p.AlertAt))
		for i, v := range *p.AlertAt {
			thresholds[i] = int16(v)
		}
		slices.Sort(thresholds)
	}
	set := map[string]int64{}
	drop := []string{}
	for k, n := range extraIncluded(p.Included) {
		if n == 0 {
			drop = append(drop, k)
		} else {
			set[k] = n
		}
	}
	lift, err := s.checkLift(ctx, id, p)
	if err != nil {
		return nil, err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := checkMeters(ctx, tx, p.Included); err != nil {
			return err
		}
		var oldCustomer string
		if lift {
			// Read under the row lock: the customer replaced is the one
			// this update replaces.
			if err := tx.QueryRow(ctx, `SELECT stripe_customer_id FROM tenants WHERE id = $1 FOR UPDATE`, id).Scan(&oldCustomer); err != nil {
				return fmt.Errorf("lock tenant %s: %w", id, err)
			}
		}
		// One statement: a concurrent update of other keys is neither lost
		// nor overwritten (the row lock orders the two).
		tag, err := tx.Exec(ctx, `UPDATE tenants SET
			name = coalesce($2, name), stripe_customer_id = coalesce($3, stripe_customer_id),
			included_input_tokens = coalesce($4, included_input_tokens),
			included_output_tokens = coalesce($5, included_output_tokens),
			included_meters = (included_meters - $6::text[]) || $7::jsonb,
			alert_url = CASE WHEN $8::text IS NULL THEN alert_url ELSE nullif($8, '') END,
			alert_secret = CASE WHEN $8::text IS NULL THEN alert_secret ELSE $9 END,
			alert_thresholds = CASE WHEN $10 THEN $11::smallint[] ELSE alert_thresholds END
			WHERE id = $1`, id, p.Name, p.StripeCustomerID, in, out, drop, set, p.AlertURL, secret, p.AlertAt != nil, thresholds)
		if err != nil {
			return fmt.Errorf("update tenant: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return errTenantNotFound(id)
		}
		if lift {
			return s.liftTx(ctx, tx, id, oldCustomer)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	d, err := s.Show(ctx, id)
	if err != nil {
		return nil, err
	}
	if secret != nil {
		d.AlertSecret = *secret
	}
	return d, nil
}
