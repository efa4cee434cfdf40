package ingest

import "context"

// SetBeforeWrites injects a failure (or a pause) point inside the ingest
// transaction, after its reads and report jobs, before its writes.
func SetBeforeWrites(s *Service, f func(ctx context.Context) error) { s.beforeWrites = f }

// SetOnGroup is told the member count of every coalesced group as it starts.
func SetOnGroup(s *Service, f func(members int)) { s.onGroup = f }
