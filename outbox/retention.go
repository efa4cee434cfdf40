package outbox

import "github.com/riverqueue/river"

// UsageLogRetentionArgs asks a worker to roll up and drop the usage log
// partitions past USAGE_LOG_RETENTION (package retention): daily.
type UsageLogRetentionArgs struct{}

// Kind implements river.JobArgs.
func (UsageLogRetentionArgs) Kind() string { return "overage.usage_log_retention" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (UsageLogRetentionArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueMaintenance}
}
