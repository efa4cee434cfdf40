// Package tenants creates tenants and their API keys and authenticates
// requests. An API key is shown once, at creation, and stored only as its
// SHA-256: a database dump reveals no usable key.
//
// The package owns the tables tenants, api_keys, tenant_subscriptions and
// closed_periods (docs/architecture.md): every write of them is here, and
// every statement about them; another package's statement may join
// tenants read-only, by key, for a column it shows (a name, a Stripe
// customer, an alert endpoint). Functions taking an overage.DB run in the
// caller's transaction when the write must commit with the caller's own
// (the Stripe webhooks: the event, its effect on the tenant and its
// record commit together).
package tenants

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
)

// keyPrefix marks overage API keys, so a leaked one is recognisable by
// secret scanners.
const keyPrefix = "ovg_"

// Store reads and writes tenants and API keys.
type Store struct {
	pool *pgxpool.Pool
	// customers and reports lift suspensions (WithStripe); nil here.
	customers CustomerChecker
	reports   ReportQueuer
}

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// CreateParams are the inputs of Create.
type CreateParams struct {
	Name                 string
	StripeCustomerID     string
	IncludedInputTokens  int64
	IncludedOutputTokens int64
	// Included is the allowance per meter key; "input" and "output" may
	// stand for the two fields above (0 there: not given), which they
	// must then agree with.
	Included map[string]int64
}

// Validate reports every problem with p at once. Fields carry their JSON
// names; the CLI translates them to its flags.
func (p CreateParams) Validate() error {
	_, _, err := p.allowances()
	return err
}

// allowances validates p and returns the default meters' allowances.
func (p CreateParams) allowances() (in, out int64, err error) {
	var fields []overage.FieldError
	if strings.TrimSpace(p.Name) == "" {
		fields = append(fields, overage.FieldError{Field: "name", Detail: "is required"})
	} else if strings.ContainsRune(p.Name, 0) {
		// PostgreSQL refuses a NUL in text: a 500 for the caller's mistake.
		fields = append(fields, overage.FieldError{Field: "name", Detail: "must not hold a NUL character"})
	}
	fields = append(fields, validateCustomer(p.StripeCustomerID)...)
	fields = append(fields, validateAllowance(p.IncludedInputTokens, p.IncludedOutputTokens)...)
	fields = append(fields, validateIncluded(p.Included)...)
	in, out = p.IncludedInputTokens, p.IncludedOutputTokens
	if in != 0 {
		fields = append(fields, alias(p.Included, overage.MeterInput, "included_input_tokens", &in)...)
	}
	if out != 0 {
		fields = append(fields, alias(p.Included, overage.MeterOutput, "included_output_tokens", &out)...)
	}
	if n, ok := p.Included[overage.MeterInput]; ok {
		in = n
	}
	if n, ok := p.Included[overage.MeterOutput]; ok {
		out = n
	}
	if len(fields) > 0 {
		return 0, 0, overage.Invalid(fields, "invalid tenant")
	}
	return in, out, nil
}

func validateCustomer(id string) []overage.FieldError {
	if !strings.HasPrefix(id, "cus_") || len(id) == len("cus_") {
		return []overage.FieldError{{Field: "stripe_customer_id", Detail: "must be a Stripe customer id (cus_...)"}}
	}
	return nil
}

func validateAllowance(in, out int64) []overage.FieldError {
	var fields []overage.FieldError
	if in < 0 {
		fields = append(fields, overage.FieldError{Field: "included_input_tokens", Detail: "must be >= 0"})
	}
	if out < 0 {
		fields = append(fields, overage.FieldError{Field: "included_output_tokens", Detail: "must be >= 0"})
	}
	return fields
}

// Created is a new tenant with the only copy of its API key.
type Created struct {
	overage.Tenant
	APIKeyID uuid.UUID `json:"api_key_id"`
	APIKey   string    `json:"api_key"`
}

// Create inserts a tenant and its first API key in one transaction.
func (s *Store) Create(ctx context.Context, p CreateParams) (*Created, error) {
	in, out, err := p.allowances()
	if err != nil {
		return nil, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return nil, fmt.Errorf("tenant id: %w", err)
	}
	// An allowance of 0 is no allowance: not stored, so included_meters
	// holds only what changes a split.
	extra := extraIncluded(p.Included)
	maps.DeleteFunc(extra, func(_ string, n int64) bool { return n == 0 })
	c := &Created{Tenant: overage.Tenant{
		ID: id, Name: p.Name, StripeCustomerID: p.StripeCustomerID,
		IncludedInputTokens: in, IncludedOutputTokens: out,
	}}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := checkMeters(ctx, tx, p.Included); err != nil {
			return err
		}
		var stored []byte
		if err := tx.QueryRow(ctx, `INSERT INTO tenants (id, name, stripe_customer_id, included_input_tokens, included_output_tokens, included_meters)
			VALUES ($1, $2, $3, $4, $5, $6) RETURNING created_at, included_meters`,
			id, p.Name, p.StripeCustomerID, in, out, extra).Scan(&c.CreatedAt, &stored); err != nil {
			return fmt.Errorf("insert tenant: %w", err)
		}
		var err error
		if c.Included, err = included(in, out, stored); err != nil {
			return err
		}
		key, err := createKey(ctx, tx, id)
		if err != nil {
			return err
		}
		c.APIKeyID, c.APIKey = key.ID, key.Key
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// CreateKey issues another API key for a tenant and returns the key alone.
func (s *Store) CreateKey(ctx context.Context, tenantID uuid.UUID) (string, error) {
	k, err := s.AddKey(ctx, tenantID)
	if err != nil {
		return "", err
	}
	return k.Key, nil
}

// AddKey issues another API key for a tenant, so keys rotate without
// downtime: add the new one, deploy it, then revoke the old one.
func (s *Store) AddKey(ctx context.Context, tenantID uuid.UUID) (*NewKey, error) {
	var key *NewKey
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// FOR SHARE: the tenant exists, and stays, until the key is in.
		var one int
		if err := tx.QueryRow(ctx, `SELECT 1 FROM tenants WHERE id = $1 FOR SHARE`, tenantID).Scan(&one); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return errTenantNotFound(tenantID)
			}
			return fmt.Errorf("find tenant: %w", err)
		}
		var err error
		key, err = createKey(ctx, tx, tenantID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return key, nil
}

// NewKey is an API key just created: the only time the key itself exists
// outside its owner's hands.
type NewKey struct {
	APIKey
	TenantID uuid.UUID `json:"tenant_id"`
	Key      string    `json:"api_key"`
}

// APIKey describes a key without revealing it: its id, for revoking it,
// and its first characters, for telling it apart.
type APIKey struct {
	ID        uuid.UUID  `json:"id"`
	Prefix    string     `json:"prefix"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

func createKey(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID) (*NewKey, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, fmt.Errorf("generate api key: %w", err)
	}
	key := keyPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	kid, err := uuid.NewV7()
	if err != nil {
		return nil, fmt.Errorf("api key id: %w", err)
	}
	k := &NewKey{APIKey: APIKey{ID: kid, Prefix: key[:len(keyPrefix)+6]}, TenantID: tenantID, Key: key}
	if err := tx.QueryRow(ctx, `INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix) VALUES ($1, $2, $3, $4) RETURNING created_at`,
		kid, tenantID, hashKey(key), k.Prefix).Scan(&k.CreatedAt); err != nil {
		return nil, fmt.Errorf("insert api key: %w", err)
	}
	return k, nil
}

// RevokeKeyByID revokes one of a tenant's API keys. Authenticate reads the
// database on every request, with no cache, so the key's next request is
// refused. Revoking a revoked key again changes nothing and answers the
// same.
func (s *Store) RevokeKeyByID(ctx context.Context, tenantID, keyID uuid.UUID) (*APIKey, error) {
	k := &APIKey{}
	// coalesce keeps the first revocation's time on a repeat.
	err := s.pool.QueryRow(ctx, `UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
		WHERE id = $1 AND tenant_id = $2 RETURNING id, key_prefix, created_at, revoked_at`, keyID, tenantID).
		Scan(&k.ID, &k.Prefix, &k.CreatedAt, &k.RevokedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, overage.NotFound("tenant %s has no API key %s", tenantID, keyID)
	}
	if err != nil {
		return nil, fmt.Errorf("revoke api key: %w", err)
	}
	return k, nil
}

// RevokeOtherKeys revokes every active API key of the tenant but keep:
// the demo's keys of earlier runs, which no one holds any more.
func (s *Store) RevokeOtherKeys(ctx context.Context, tenantID, keep uuid.UUID) error {
	if _, err := s.pool.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE tenant_id = $1 AND id <> $2 AND revoked_at IS NULL`, tenantID, keep); err != nil {
		return fmt.Errorf("revoke the other API keys of tenant %s: %w", tenantID, err)
	}
	return nil
}

// RevokeKey revokes an API key; requests with it are refused from then on.
func (s *Store) RevokeKey(ctx context.Context, key string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1 AND revoked_at IS NULL`, hashKey(key))
	if err != nil {
		return fmt.Errorf("revoke api key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return overage.NotFound("no active API key matches")
	}
	return nil
}

// Authenticate returns who key speaks for — its tenant, the key's id and
// whether the tenant is suspended — or an EUNAUTHORIZED error for a
// missing, unknown or revoked key. One statement: the suspension is read
// with the key, by the tenant's primary key, so checking it costs no
// query of its own.
func (s *Store) Authenticate(ctx context.Context, key string) (overage.Principal, error) {
	if !WellFormedKey(key) {
		// No key of ours looks like this: refused without a query, so a
		// flood of made-up keys costs the database nothing.
		return overage.Principal{}, errUnauthorized
	}
	var p overage.Principal
	err := s.pool.QueryRow(ctx, `SELECT k.tenant_id, k.id, t.suspended_at IS NOT NULL
		FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
		WHERE k.key_hash = $1 AND k.revoked_at IS NULL`, hashKey(key)).Scan(&p.TenantID, &p.KeyID, &p.Suspended)
	if errors.Is(err, pgx.ErrNoRows) {
		return overage.Principal{}, errUnauthorized
	}
	if err != nil {
		return overage.Principal{}, fmt.Errorf("authenticate: %w", err)
	}
	return p, nil
}

// keyLen is the length of every API key: the prefix and 32 random bytes
// in unpadded base64url.
var keyLen = len(keyPrefix) + base64.RawURLEncoding.EncodedLen(32)

// WellFormedKey reports whether key has the shape of an API key this
// service makes: "ovg_" and 43 base64url characters.
func WellFormedKey(key string) bool {
	if len(key) != keyLen || !strings.HasPrefix(key, keyPrefix) {
		return false
	}
	for i := len(keyPrefix); i < len(key); i++ {
		c := key[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

var errUnauthorized = overage.Errorf(overage.EUNAUTHORIZED, "unauthorized", "missing, unknown or revoked API key")

func hashKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// Get returns one tenant.
func (s *Store) Get(ctx context.Context, id uuid.UUID) (*overage.Tenant, error) {
	t := &overage.Tenant{}
	var extra []byte
	err := s.pool.QueryRow(ctx, `SELECT id, name, stripe_customer_id, included_input_tokens, included_output_tokens, included_meters, created_at
		FROM tenants WHERE id = $1`, id).Scan(&t.ID, &t.Name, &t.StripeCustomerID, &t.IncludedInputTokens, &t.IncludedOutputTokens, &extra, &t.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errTenantNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("get tenant: %w", err)
	}
	if t.Included, err = included(t.IncludedInputTokens, t.IncludedOutputTokens, extra); err != nil {
		return nil, err
	}
	return t, nil
}

// Find returns the oldest tenant named name with the Stripe customer, and
// false when there is none.
func (s *Store) Find(ctx context.Context, name, customer string) (uuid.UUID, bool, error) {
	var id uuid.UUID
	err := s.pool.QueryRow(ctx, `SELECT id FROM tenants WHERE name = $1 AND stripe_customer_id = $2 ORDER BY created_at, id LIMIT 1`,
		name, customer).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return uuid.Nil, false, nil
	}
	if err != nil {
		return uuid.Nil, false, fmt.Errorf("find tenant %s of %s: %w", name, customer, err)
	}
	return id, true, nil
}

func errTenantNotFound(id uuid.UUID) error {
	return overage.NotFound("tenant %s not found", id)
}
