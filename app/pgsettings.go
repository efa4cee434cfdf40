package app

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The PostgreSQL settings ingest's rate at volume depends on, and the
// least of each the product is measured to hold its rate with
// (docs/limits.md, "PostgreSQL at volume"). Lookups by idempotency key
// and by request_id probe unique indexes of random digests: once a
// month's logs or a day's keys outgrow shared_buffers, each probe reads
// a page from outside it, and after every checkpoint the first insert
// into each leaf writes the whole page to the WAL, which max_wal_size
// and checkpoint_timeout space out and wal_compression shrinks. On
// PostgreSQL's defaults (128 MB, 1 GB, off) batches at 20 million logs
// ran at two thirds of their rate on empty tables; on these they hold.
const (
	MinSharedBuffers = 1 << 30
	MinMaxWALSize    = 4 << 30
)

// ServerSettings are what the server runs with.
type ServerSettings struct {
	SharedBuffers     int64 // bytes
	MaxWALSize        int64 // bytes
	CheckpointTimeout time.Duration
	WALCompression    string
	Autovacuum        bool
	HugePages         string // off, try or on
}

// Problems names each setting below what ingest at volume needs, or none.
func (s ServerSettings) Problems() []string {
	var p []string
	if s.SharedBuffers < MinSharedBuffers {
		p = append(p, fmt.Sprintf("shared_buffers is %d MB (at least 1 GB, about a quarter of the server's memory)", s.SharedBuffers>>20))
	}
	if s.MaxWALSize < MinMaxWALSize {
		p = append(p, fmt.Sprintf("max_wal_size is %d MB (at least 4 GB)", s.MaxWALSize>>20))
	}
	if s.WALCompression == "off" {
		p = append(p, "wal_compression is off (lz4, or on)")
	}
	if !s.Autovacuum {
		// Billing updates each log; without autovacuum the dead rows
		// are never reclaimed and no table gets statistics.
		p = append(p, "autovacuum is off (on)")
	}
	if s.HugePages == "off" {
		// A pool of gigabytes in 4 KB pages: a TLB miss on every random
		// index leaf, and page tables the kernel's reclaim scans once the
		// page cache is full. "try" is not named: PostgreSQL 15 does not
		// say whether it got them (HugePages_Rsvd in /proc/meminfo does).
		p = append(p, "huge_pages is off (on, with vm.nr_hugepages at least shared_memory_size_in_huge_pages)")
	}
	return p
}

// ReadServerSettings reads them through pool.
func ReadServerSettings(ctx context.Context, pool *pgxpool.Pool) (ServerSettings, error) {
	var s ServerSettings
	var timeout int64
	// current_setting shows sizes with a unit (128MB, 1GB), which
	// pg_size_bytes reads; checkpoint_timeout's setting is in seconds.
	err := pool.QueryRow(ctx, `SELECT pg_size_bytes(current_setting('shared_buffers')), pg_size_bytes(current_setting('max_wal_size')),
			(SELECT setting::bigint FROM pg_settings WHERE name = 'checkpoint_timeout'),
			current_setting('wal_compression'), current_setting('autovacuum')::bool, current_setting('huge_pages')`).Scan(&s.SharedBuffers, &s.MaxWALSize, &timeout, &s.WALCompression, &s.Autovacuum, &s.HugePages)
	if err != nil {
		return s, fmt.Errorf("read PostgreSQL's settings: %w", err)
	}
	s.CheckpointTimeout = time.Duration(timeout) * time.Second
	return s, nil
}

// WarnServerSettings logs one warning when the server's memory and WAL
// settings are below what ingest at volume needs, or autovacuum is off. Nothing fails: a small
// or new deployment runs well on the defaults, and only an operator can
// change them.
func WarnServerSettings(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := ReadServerSettings(ctx, pool)
	if err != nil {
		logger.Warn("PostgreSQL settings: cannot read them", "err", err)
		return
	}
	if p := s.Problems(); len(p) > 0 {
		logger.Warn("PostgreSQL settings: "+strings.Join(p, "; ")+": below what a deployment at volume needs (millions of logs a month); see docs/limits.md, \"PostgreSQL at volume\"",
			"shared_buffers_bytes", s.SharedBuffers, "max_wal_size_bytes", s.MaxWALSize,
			"checkpoint_timeout", s.CheckpointTimeout.String(), "wal_compression", s.WALCompression, "autovacuum", s.Autovacuum, "huge_pages", s.HugePages)
	}
}
