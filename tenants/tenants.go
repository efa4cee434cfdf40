// Package tenants creates tenants and their API keys and authenticates
// requests. An API key is shown once, at creation, and stored only as its
// SHA-256: a database dump reveals no usable key.
package tenants

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
)

// keyPrefix marks overage API keys, so a leaked one is recognisable by
// secret scanners.
const keyPrefix = "ovg_"

// Store reads and writes tenants and API keys.
type Store struct{ pool *pgxpool.Pool }

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// CreateParams are the inputs of Create.
type CreateParams struct {
	Name                 string
	StripeCustomerID     string
	IncludedInputTokens  int64
	IncludedOutputTokens int64
}

// Validate reports every problem with p at once.
func (p CreateParams) Validate() error {
	var fields []overage.FieldError
	if strings.TrimSpace(p.Name) == "" {
		fields = append(fields, overage.FieldError{Field: "name", Detail: "is required"})
	}
	if !strings.HasPrefix(p.StripeCustomerID, "cus_") {
		fields = append(fields, overage.FieldError{Field: "stripe-customer", Detail: "must be a Stripe customer id (cus_...)"})
	}
	if p.IncludedInputTokens < 0 {
		fields = append(fields, overage.FieldError{Field: "included-input-tokens", Detail: "must be >= 0"})
	}
	if p.IncludedOutputTokens < 0 {
		fields = append(fields, overage.FieldError{Field: "included-output-tokens", Detail: "must be >= 0"})
	}
	if len(fields) > 0 {
		return overage.Invalid(fields, "invalid tenant")
	}
	return nil
}

// Created is a new tenant with the only copy of its API key.
type Created struct {
	overage.Tenant
	APIKey string `json:"api_key"`
}

// Create inserts a tenant and its first API key in one transaction.
func (s *Store) Create(ctx context.Context, p CreateParams) (*Created, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return nil, fmt.Errorf("tenant id: %w", err)
	}
	c := &Created{Tenant: overage.Tenant{
		ID: id, Name: p.Name, StripeCustomerID: p.StripeCustomerID,
		IncludedInputTokens: p.IncludedInputTokens, IncludedOutputTokens: p.IncludedOutputTokens,
	}}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO tenants (id, name, stripe_customer_id, included_input_tokens, included_output_tokens)
			VALUES ($1, $2, $3, $4, $5) RETURNING created_at`,
			id, p.Name, p.StripeCustomerID, p.IncludedInputTokens, p.IncludedOutputTokens).Scan(&c.CreatedAt); err != nil {
			return fmt.Errorf("insert tenant: %w", err)
		}
		key, err := createKey(ctx, tx, id)
		c.APIKey = key
		return err
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// CreateKey issues another API key for a tenant, e.g. to rotate one.
func (s *Store) CreateKey(ctx context.Context, tenantID uuid.UUID) (string, error) {
	var key string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		key, err = createKey(ctx, tx, tenantID)
		return err
	})
	return key, err
}

func createKey(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID) (string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("generate api key: %w", err)
	}
	key := keyPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	kid, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("api key id: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO api_keys (id, tenant_id, key_hash, key_prefix) VALUES ($1, $2, $3, $4)`,
		kid, tenantID, hashKey(key), key[:len(keyPrefix)+6]); err != nil {
		return "", fmt.Errorf("insert api key: %w", err)
	}
	return key, nil
}

// RevokeKey revokes an API key; requests with it are refused from then on.
func (s *Store) RevokeKey(ctx context.Context, key string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1 AND revoked_at IS NULL`, hashKey(key))
	if err != nil {
		return fmt.Errorf("revoke api key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return overage.Errorf(overage.ENOTFOUND, "not-found", "no active API key matches")
	}
	return nil
}

// Authenticate returns the tenant id that key belongs to, or an
// EUNAUTHORIZED error for a missing, unknown or revoked key.
func (s *Store) Authenticate(ctx context.Context, key string) (uuid.UUID, error) {
	if !strings.HasPrefix(key, keyPrefix) {
		return uuid.Nil, errUnauthorized
	}
	var id uuid.UUID
	err := s.pool.QueryRow(ctx, `SELECT tenant_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL`, hashKey(key)).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return uuid.Nil, errUnauthorized
	}
	if err != nil {
		return uuid.Nil, fmt.Errorf("authenticate: %w", err)
	}
	return id, nil
}

var errUnauthorized = overage.Errorf(overage.EUNAUTHORIZED, "unauthorized", "missing, unknown or revoked API key")

func hashKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// Get returns one tenant.
func (s *Store) Get(ctx context.Context, id uuid.UUID) (*overage.Tenant, error) {
	t := &overage.Tenant{}
	err := s.pool.QueryRow(ctx, `SELECT id, name, stripe_customer_id, included_input_tokens, included_output_tokens, created_at
		FROM tenants WHERE id = $1`, id).Scan(&t.ID, &t.Name, &t.StripeCustomerID, &t.IncludedInputTokens, &t.IncludedOutputTokens, &t.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, overage.Errorf(overage.ENOTFOUND, "not-found", "tenant %s not found", id)
	}
	if err != nil {
		return nil, fmt.Errorf("get tenant: %w", err)
	}
	return t, nil
}
