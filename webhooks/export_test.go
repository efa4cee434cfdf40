package webhooks

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// AddPartition appends one partition after the last, up to until or the
// next month's start (from MINVALUE when there is none): a test's bounds
// need not fall on months.
func AddPartition(ctx context.Context, db DB, until time.Time) (string, error) {
	var name string
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lockPartitions(ctx, tx); err != nil {
			return err
		}
		var err error
		name, err = addPartition(ctx, tx, until)
		return err
	})
	return name, err
}

// SetBeforeInsert makes Store call f between its lookup and its insert.
func (h *Handler) SetBeforeInsert(f func(StoredEvent)) { h.beforeInsert = f }
