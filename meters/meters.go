// Package meters owns the meter catalog (tables meters, meter_models and
// meter_catalog): creating, listing and archiving meters, and the catalog
// every process routes usage with and names meter events by.
//
// The two default meters always exist; their event names are the
// STRIPE_METER_INPUT_EVENT and STRIPE_METER_OUTPUT_EVENT settings of the
// process that reads them, so the store is built with them.
package meters

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/overage-billing/overage"
)

// Store reads and changes the meter catalog.
type Store struct {
	db                      *pgxpool.Pool
	inputEvent, outputEvent string

	mu  sync.Mutex
	cat *overage.Catalog
	// floor is the newest catalog version this store's own changes
	// committed: a catalog older than it is never kept or returned, so a
	// read that started before a change and ends after it cannot put the
	// old catalog back.
	floor int64
}

// NewStore returns a store; inputEvent and outputEvent name the default
// meters' Stripe meter events.
func NewStore(db *pgxpool.Pool, inputEvent, outputEvent string) *Store {
	return &Store{db: db, inputEvent: inputEvent, outputEvent: outputEvent}
}

// CreateParams is a new meter.
type CreateParams struct {
	Key       string            `json:"key"`
	EventName string            `json:"event_name"`
	TokenType overage.TokenType `json:"token_type"`
	// Models defaults to every model ("*").
	Models []string `json:"models"`
}

// Validate names every bad field.
func (p *CreateParams) Validate() error {
	var fields []overage.FieldError
	switch {
	case p.Key == "":
		fields = append(fields, overage.FieldError{Field: "key", Detail: "is required"})
	case !overage.ValidMeterKey(p.Key):
		fields = append(fields, overage.FieldError{Field: "key", Detail: "must be 1 to 40 of a-z, 0-9 and _"})
	case overage.IsDefaultMeter(p.Key):
		fields = append(fields, overage.FieldError{Field: "key", Detail: "is a default meter's key (input, output): it always exists"})
	}
	switch {
	case p.EventName == "":
		fields = append(fields, overage.FieldError{Field: "event_name", Detail: "is required: the Stripe meter's event name"})
	case len(p.EventName) > 100 || strings.TrimSpace(p.EventName) != p.EventName:
		fields = append(fields, overage.FieldError{Field: "event_name", Detail: "must be at most 100 characters without surrounding spaces"})
	case hasControl(p.EventName):
		// A NUL would reach PostgreSQL, which refuses it in text: a 500
		// for what is the caller's mistake.
		fields = append(fields, overage.FieldError{Field: "event_name", Detail: "must not hold control characters"})
	}
	if !p.TokenType.Valid() {
		fields = append(fields, overage.FieldError{Field: "token_type",
			Detail: "must be one of input, cache_read, cache_write, output, reasoning"})
	}
	if len(p.Models) == 0 {
		p.Models = []string{"*"}
	}
	seen := map[string]bool{}
	for _, m := range p.Models {
		if !overage.ValidModelPattern(m) || hasControl(m) {
			fields = append(fields, overage.FieldError{Field: "models",
				Detail: fmt.Sprintf("%q is not a model pattern: a model id, a prefix ending in *, or *", m)})
			break
		}
		if seen[m] {
			fields = append(fields, overage.FieldError{Field: "models", Detail: fmt.Sprintf("%q is listed twice", m)})
			break
		}
		seen[m] = true
	}
	if len(fields) > 0 {
		// The fields carry the details: the CLI names each as its flag, the
		// API lists them in errors.
		return overage.Invalid(fields, "invalid meter")
	}
	return nil
}

func hasControl(s string) bool {
	return strings.IndexFunc(s, unicode.IsControl) >= 0
}

const columns = `key, coalesce(event_name, ''), token_type, models, archived_at, created_at`

func scan(row pgx.Row) (overage.Meter, error) {
	var m overage.Meter
	err := row.Scan(&m.Key, &m.EventName, &m.TokenType, &m.Models, &m.ArchivedAt, &m.CreatedAt)
	m.CreatedAt = m.CreatedAt.UTC()
	if m.ArchivedAt != nil {
		t := m.ArchivedAt.UTC()
		m.ArchivedAt = &t
	}
	return m, err
}

func (s *Store) named(m overage.Meter) overage.Meter {
	switch m.Key {
	case overage.MeterInput:
		m.EventName = s.inputEvent
	case overage.MeterOutput:
		m.EventName = s.outputEvent
	}
	return m
}

// Create adds a meter. It applies to usage recorded after it commits. A
// second active meter of the same token type and pattern is refused
// (Conflict), by the database's unique index, whoever raced.
func (s *Store) Create(ctx context.Context, p CreateParams) (*overage.Meter, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var m overage.Meter
	var version int64
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var err error
		m, err = scan(tx.QueryRow(ctx, `INSERT INTO meters (key, event_name, token_type, models) VALUES ($1, $2, $3, $4)
			RETURNING `+columns, p.Key, p.EventName, string(p.TokenType), p.Models))
		if err != nil {
			return err
		}
		// The patterns go in in one order for every creator: two creates
		// sharing patterns listed in different orders would otherwise each
		// hold one's index entry and wait for the other's, and PostgreSQL
		// would answer one with a deadlock (a 500) instead of the 409.
		if _, err := tx.Exec(ctx, `INSERT INTO meter_models (meter, token_type, pattern)
			SELECT $1, $2, p FROM unnest($3::text[]) AS p ORDER BY p COLLATE "C"`, p.Key, string(p.TokenType), p.Models); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `UPDATE meter_catalog SET version = version + 1 RETURNING version`).Scan(&version)
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		if pgErr.ConstraintName == "meters_pkey" {
			return nil, overage.Errorf(overage.ECONFLICT, "meter-exists", "a meter with key %q already exists", p.Key)
		}
		return nil, overage.Errorf(overage.ECONFLICT, "meter-exists", "an active %s meter already has one of the patterns %s: archive it first, or use a more specific pattern",
			p.TokenType, strings.Join(p.Models, ", "))
	}
	if err != nil {
		return nil, fmt.Errorf("create meter %s: %w", p.Key, err)
	}
	s.changed(version)
	m = s.named(m)
	return &m, nil
}

// Archive stops a meter routing usage recorded after it commits; usage it
// already took stays on it and is billed on it. Archiving twice changes
// nothing. The default meters cannot be archived.
func (s *Store) Archive(ctx context.Context, key string) (*overage.Meter, error) {
	if overage.IsDefaultMeter(key) {
		return nil, overage.Invalid([]overage.FieldError{{Field: "key", Detail: "is a default meter: it cannot be archived"}},
			"meter %q is a default meter: it cannot be archived", key)
	}
	var m overage.Meter
	var version int64
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var err error
		m, err = scan(tx.QueryRow(ctx, `UPDATE meters SET archived_at = coalesce(archived_at, now()) WHERE key = $1
			RETURNING `+columns, key))
		if err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE meter_models SET archived = true WHERE meter = $1 AND NOT archived`, key)
		if err != nil || tag.RowsAffected() == 0 {
			// Archived already: the catalog did not change.
			return err
		}
		return tx.QueryRow(ctx, `UPDATE meter_catalog SET version = version + 1 RETURNING version`).Scan(&version)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, overage.NotFound("meter %q not found", key)
	}
	if err != nil {
		return nil, fmt.Errorf("archive meter %s: %w", key, err)
	}
	s.changed(version)
	m = s.named(m)
	return &m, nil
}

// List returns every meter, active and archived, by key.
func (s *Store) List(ctx context.Context) ([]overage.Meter, error) {
	if s.db == nil {
		return nil, errors.New("list meters: the store has no pool")
	}
	_, ms, err := s.read(ctx, s.db)
	return ms, err
}

// Querier is a pool, a connection or a transaction: what reads the catalog.
type Querier interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

func (s *Store) read(ctx context.Context, db Querier) (int64, []overage.Meter, error) {
	b := &pgx.Batch{}
	b.Queue(`SELECT version FROM meter_catalog`)
	b.Queue(`SELECT ` + columns + ` FROM meters ORDER BY key`)
	br := db.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	var version int64
	if err := br.QueryRow().Scan(&version); err != nil {
		return 0, nil, fmt.Errorf("read meter catalog: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return 0, nil, fmt.Errorf("read meters: %w", err)
	}
	ms, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (overage.Meter, error) {
		m, err := scan(r)
		return s.named(m), err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("read meters: %w", err)
	}
	return version, ms, nil
}

// Catalog returns the catalog, read once (through q: a caller holding a
// connection passes it, so a full pool never waits on itself) and kept
// until a change this store made, or Current, says it is stale.
func (s *Store) Catalog(ctx context.Context, q Querier) (*overage.Catalog, error) {
	s.mu.Lock()
	c := s.cat
	s.mu.Unlock()
	if c != nil {
		return c, nil
	}
	return s.reload(ctx, q)
}

// Current returns a catalog of version at least version (the
// meter_catalog.version a transaction read), reading it through db when
// the one kept is older. A log naming a meter the kept catalog does not
// know reloads it too (see Knows).
func (s *Store) Current(ctx context.Context, db Querier, version int64) (*overage.Catalog, error) {
	s.mu.Lock()
	c := s.cat
	s.mu.Unlock()
	if c != nil && c.Version >= version {
		return c, nil
	}
	return s.reload(ctx, db)
}

// Knowing returns a catalog that holds every meter of keys, reloading the
// one kept when it lacks one (a meter created by another process).
func (s *Store) Knowing(ctx context.Context, q Querier, keys []string) (*overage.Catalog, error) {
	c, err := s.Catalog(ctx, q)
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		if _, ok := c.Meter(k); !ok {
			return s.reload(ctx, q)
		}
	}
	return c, nil
}

func (s *Store) reload(ctx context.Context, db Querier) (*overage.Catalog, error) {
	v, ms, err := s.read(ctx, db)
	if err != nil {
		return nil, err
	}
	c := overage.NewCatalog(v, ms)
	s.mu.Lock()
	if v >= s.floor && (s.cat == nil || s.cat.Version <= v) {
		s.cat = c
	}
	s.mu.Unlock()
	return c, nil
}

// changed records that this store committed catalog version (0: nothing
// changed) and drops the kept catalog if it is older.
func (s *Store) changed(version int64) {
	s.mu.Lock()
	s.floor = max(s.floor, version)
	if s.cat != nil && s.cat.Version < s.floor {
		s.cat = nil
	}
	s.mu.Unlock()
}
