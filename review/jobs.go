package review

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/overage-billing/overage/outbox"
)

// queueReport queues the tenant's report job in tx. A job already queued
// for this batch period is reused rather than doubled; a job running right
// now is no obstacle: the reopened reports are picked up by this one.
func queueReport(ctx context.Context, tx pgx.Tx, inserter *outbox.Inserter, tenantID uuid.UUID) (*QueuedJob, error) {
	res, err := inserter.InsertTenantReportTx(ctx, tx, tenantID)
	if err != nil {
		return nil, err
	}
	return &QueuedJob{ID: res.Job.ID, State: string(res.Job.State), ScheduledAt: res.Job.ScheduledAt.UTC(), Existing: res.UniqueSkippedAsDuplicate}, nil
}

// auditMembers records the decision res for the other members of the
// named log's reports, in tx, as the named log's row says.
func auditMembers(ctx context.Context, tx pgx.Tx, res *Resolution, members []uuid.UUID) error {
	if len(members) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, len(members))
	for i := range ids {
		id, err := uuid.NewV7()
		if err != nil {
			return fmt.Errorf("audit id: %w", err)
		}
		ids[i] = id
	}
	if _, err := tx.Exec(ctx, `INSERT INTO review_actions
			(id, usage_log_id, action, reason, actor, previous_status, previous_message, first_attempt_at, forced)
		SELECT v.id, v.log, $3, $4 || ' (with the report of usage log ' || $5 || ')', $6, $7, $8, $9, $10
		FROM unnest($1::uuid[], $2::uuid[]) AS v (id, log)`,
		ids, members, string(res.Action), res.Reason, res.UsageLogID.String(), res.Actor, string(res.PreviousStatus),
		res.PreviousMessage, res.FirstAttemptAt, res.Forced); err != nil {
		return fmt.Errorf("record review of the report's other members: %w", err)
	}
	return nil
}
