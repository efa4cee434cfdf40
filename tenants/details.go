package tenants

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
	"github.com/overage-billing/overage/alerts"
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
	SELECT t.id, t.name, t.stripe_customer_id, t.included_input_tokens, t.included_output_tokens, t.created_at,
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
		if err := rows.Scan(&d.ID, &d.Name, &d.StripeCustomerID, &d.IncludedInputTokens, &d.IncludedOutputTokens, &d.CreatedAt,
			&d.SuspendedAt, &d.SuspendedReason, &d.AlertURL, &d.AlertAt, &subID, &subStatus, &subStart, &subEnd, &d.APIKeys); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read tenants: %w", err)
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
	// AlertURL sets the alert endpoint (a new signing secret is issued and
	// shown once); "" removes it and its secret. AlertAt sets the
	// thresholds, percentages 1 to 100; [] removes them.
	AlertURL *string `json:"alert_url"`
	AlertAt  *[]int  `json:"alert_at"`
}

// Validate reports every problem with p at once.
func (p UpdateParams) Validate() error {
	var fields []overage.FieldError
	if p.Name == nil && p.StripeCustomerID == nil && p.IncludedInputTokens == nil && p.IncludedOutputTokens == nil &&
		p.AlertURL == nil && p.AlertAt == nil {
		fields = append(fields, overage.FieldError{Field: "body", Detail: "names nothing to change"})
	}
	if p.Name != nil && strings.TrimSpace(*p.Name) == "" {
		fields = append(fields, overage.FieldError{Field: "name", Detail: "must not be empty"})
	}
	if p.StripeCustomerID != nil {
		fields = append(fields, validateCustomer(*p.StripeCustomerID)...)
	}
	var in, out int64
	if p.IncludedInputTokens != nil {
		in = *p.IncludedInputTokens
	}
	if p.IncludedOutputTokens != nil {
		out = *p.IncludedOutputTokens
	}
	fields = append(fields, validateAllowance(in, out)...)
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
		return overage.Invalid(fields, "invalid tenant update")
	}
	return nil
}

// Update changes a tenant and returns its details. Ingest reads the
// allowance when it records each event, so a new allowance applies to
// usage recorded after the change; no recorded log is recomputed.
func (s *Store) Update(ctx context.Context, id uuid.UUID, p UpdateParams) (*Details, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	// The secret is issued with the URL: $6 says whether the URL changes,
	// $7 is the new secret (NULL when the URL is removed).
	var secret *string
	if p.AlertURL != nil && *p.AlertURL != "" {
		sec, err := alerts.NewSecret()
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
	tag, err := s.pool.Exec(ctx, `UPDATE tenants SET
		name = coalesce($2, name), stripe_customer_id = coalesce($3, stripe_customer_id),
		included_input_tokens = coalesce($4, included_input_tokens),
		included_output_tokens = coalesce($5, included_output_tokens),
		alert_url = CASE WHEN $6::text IS NULL THEN alert_url ELSE nullif($6, '') END,
		alert_secret = CASE WHEN $6::text IS NULL THEN alert_secret ELSE $7 END,
		alert_thresholds = CASE WHEN $8 THEN $9::smallint[] ELSE alert_thresholds END
		WHERE id = $1`, id, p.Name, p.StripeCustomerID, p.IncludedInputTokens, p.IncludedOutputTokens,
		p.AlertURL, secret, p.AlertAt != nil, thresholds)
	if err != nil {
		return nil, fmt.Errorf("update tenant: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return nil, errTenantNotFound(id)
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
