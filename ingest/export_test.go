package ingest

import "context"

// SetAfterLogInsert injects a failure point inside the ingest transaction.
func SetAfterLogInsert(s *Service, f func(ctx context.Context) error) { s.afterLogInsert = f }
