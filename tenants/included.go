package tenants

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage"
)

// Allowances are per meter: "included": {"<meter key>": N}. The default
// meters keep their columns (included_input_tokens, included_output_tokens,
// which ingest has always read); every other meter's allowance is a key of
// tenants.included_meters. included_input_tokens and included_output_tokens
// stay in the JSON as the same numbers as included.input and
// included.output.

// includedField names one meter's allowance in errors: included.<key>.
func includedField(key string) string { return "included." + key }

// validateIncluded checks the shape of an "included" object: meter keys
// and whole numbers >= 0. Whether each key names a meter is the
// database's to say (checkMeters).
func validateIncluded(included map[string]int64) []overage.FieldError {
	var fields []overage.FieldError
	for _, k := range slices.Sorted(maps.Keys(included)) {
		switch {
		case !overage.ValidMeterKey(k):
			fields = append(fields, overage.FieldError{Field: includedField(k), Detail: "is not a meter key (1 to 40 of a-z, 0-9 and _)"})
		case included[k] < 0:
			fields = append(fields, overage.FieldError{Field: includedField(k), Detail: "must be >= 0"})
		}
	}
	return fields
}

// alias merges a default meter's old field into included: either may be
// given; both given must agree.
func alias(included map[string]int64, key, oldField string, old *int64) []overage.FieldError {
	n, ok := included[key]
	switch {
	case old == nil || !ok:
		return nil
	case *old != n:
		return []overage.FieldError{{Field: includedField(key), Detail: fmt.Sprintf("is %d but %s is %d: give one of them", n, oldField, *old)}}
	}
	return nil
}

// extraIncluded is the part of included that lives in included_meters:
// the meters other than the defaults.
func extraIncluded(included map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, n := range included {
		if !overage.IsDefaultMeter(k) {
			out[k] = n
		}
	}
	return out
}

// checkMeters refuses keys that name no meter, each by its field. An
// archived meter's key is accepted: it still exists (meters are never
// deleted), and a tenant's allowance on it changes nothing new.
func checkMeters(ctx context.Context, tx pgx.Tx, included map[string]int64) error {
	var keys []string
	for k := range included {
		if !overage.IsDefaultMeter(k) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	// FOR SHARE is not needed: a meter is never deleted, so one seen here
	// exists when the tenant commits.
	var known []string
	if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(key), '{}') FROM meters WHERE key = ANY($1)`, keys).Scan(&known); err != nil {
		return fmt.Errorf("check included meters: %w", err)
	}
	var fields []overage.FieldError
	for _, k := range slices.Sorted(slices.Values(keys)) {
		if !slices.Contains(known, k) {
			fields = append(fields, overage.FieldError{Field: includedField(k),
				Detail: fmt.Sprintf("names no meter: create it first (overage meter create --key %s ...)", k)})
		}
	}
	if len(fields) > 0 {
		return overage.Invalid(fields, "invalid allowance")
	}
	return nil
}

// included is a tenant's allowances as the JSON shows them: input and
// output from their columns, the other meters from included_meters.
func included(in, out int64, extra []byte) (map[string]int64, error) {
	m := map[string]int64{}
	if len(extra) > 0 {
		if err := json.Unmarshal(extra, &m); err != nil {
			return nil, fmt.Errorf("read included_meters: %w", err)
		}
	}
	m[overage.MeterInput], m[overage.MeterOutput] = in, out
	return m, nil
}
