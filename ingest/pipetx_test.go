package ingest

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/outbox"
)

// pipeTx is a pgx.Tx whose Begin fails: River's InsertTx must run its
// insert in the caller's transaction without a nested one (a savepoint).
// If an upgrade of River opened one, every ingest transaction would fail;
// this test names why.
func TestRiverInsertTxRunsInAPipeTxWithoutANestedTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := beginPipeTx(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.release(ctx)
	if _, err := tx.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if err := outbox.NewInserter(rc, 5).InsertReportsTx(ctx, tx, uuid.New(), []uuid.UUID{uuid.New()}); err != nil {
		t.Fatalf("River's InsertTx in a pipeTx: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = $1`, outbox.ReportArgs{}.Kind()).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d report jobs after the commit (%v), want 1", n, err)
	}
}
