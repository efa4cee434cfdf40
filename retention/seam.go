package retention

import "github.com/overage-billing/overage/usagelog"

// Partition is one range of usage log ids: its usage_logs partition and
// the usage_reports partition of the same range.
type Partition = usagelog.Partition

// listPartitions lists the partitions oldest first.
var listPartitions = usagelog.Partitions
