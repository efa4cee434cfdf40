package idempotency

import (
	"context"
	"log/slog"
	"time"
)

// CompressedLayout is production's layout with partitions width wide, as
// the development build makes it for bench/expiry.sh.
type CompressedLayout struct{ l layout }

func Compressed(width time.Duration) CompressedLayout {
	return CompressedLayout{production.scaled(width)}
}

func (c CompressedLayout) TTL() time.Duration        { return c.l.TTL }
func (c CompressedLayout) DropMargin() time.Duration { return c.l.DropMargin }
func (c CompressedLayout) Ahead() int                { return c.l.Ahead }
func (c CompressedLayout) Name(lower time.Time) string {
	return c.l.name(lower)
}
func (c CompressedLayout) Maintain(ctx context.Context, db DB, logger *slog.Logger) error {
	return maintain(ctx, db, logger, c.l)
}
func (c CompressedLayout) EnsurePartitions(ctx context.Context, db DB) ([]string, error) {
	return ensurePartitions(ctx, db, c.l)
}
