package ingest

import "context"

// SetBeforeWrites injects a failure (or a pause) point inside the ingest
// transaction, after its reads and report jobs, before its writes.
func SetBeforeWrites(s *Service, f func(ctx context.Context) error) { s.beforeWrites = f }
