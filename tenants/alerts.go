package tenants

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
)

// A tenant's alert settings — its endpoint, the endpoint's signing secret
// and its thresholds — are columns of tenants, set by Update and read by
// the alerts package, which records and delivers the events.

// alertSecretPrefix marks a signing secret.
const alertSecretPrefix = "whsec_"

// NewAlertSecret returns a new signing secret for an alert endpoint:
// "whsec_" and 32 random bytes. Update issues one with each new URL.
func NewAlertSecret() (string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	return alertSecretPrefix + base64.RawURLEncoding.EncodeToString(raw[:]), nil
}

// AlertSettings reads, through db (ingest's transaction), the tenant's
// alert thresholds and whether it has an endpoint: none for a tenant that
// does not exist.
func AlertSettings(ctx context.Context, db overage.DB, id uuid.UUID) (thresholds []int16, hasURL bool, err error) {
	err = db.QueryRow(ctx, `SELECT coalesce(alert_thresholds, '{}'), alert_url IS NOT NULL FROM tenants WHERE id = $1`, id).
		Scan(&thresholds, &hasURL)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, false, fmt.Errorf("read alert thresholds: %w", err)
	}
	return thresholds, hasURL, nil
}
