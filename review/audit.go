package review

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

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
