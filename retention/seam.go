package retention

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/overage-billing/overage"
)

// Partition is one range of usage log ids: its usage_logs partition and
// the usage_reports partition of the same range (usagelog.Partition once
// the partitioning lands).
type Partition struct {
	Name, Reports string
	Lower         *time.Time
	Upper         time.Time
	LowerID       *uuid.UUID
	UpperID       uuid.UUID
}

// listPartitions lists the partitions oldest first (usagelog.Partitions).
var listPartitions = func(context.Context, overage.DB) ([]Partition, error) {
	return nil, errors.New("usage_logs is not partitioned yet")
}
