package ingest

import (
	"context"

	"github.com/google/uuid"
)

// SetBeforeWrites injects a failure (or a pause) point inside the ingest
// transaction, after its reads and report jobs, before its writes.
func SetBeforeWrites(s *Service, f func(ctx context.Context) error) { s.beforeWrites = f }

// SetOnGroup is told the member count of every coalesced group as it starts.
func SetOnGroup(s *Service, f func(members int)) { s.onGroup = f }

// Pending counts the single events of tenant waiting for a group.
func Pending(s *Service, tenant uuid.UUID) int {
	c := s.coalesce
	c.mu.Lock()
	defer c.mu.Unlock()
	if q := c.tenants[tenant]; q != nil {
		return len(q.pending)
	}
	return 0
}
