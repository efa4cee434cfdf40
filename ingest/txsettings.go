package ingest

import (
	"strconv"

	"github.com/overage-billing/overage/internal/pgplan"
)

// The SQL every ingest transaction runs under and reads and writes its
// stored answers with, shared by the pipelined path (single events,
// groups, batches) and the claimed-key path (corrections, checkpoints).
// The stored answers' SQL is the idempotency package's, which owns the
// table.

// txSettingsSQL bounds the transaction (as SET LOCAL would: the key stays
// in progress exactly as long as it) and keeps its plans on the indexes.
//
// Every read of an ingest transaction is a lookup by a whole key. A plan
// made while a table was small or not yet analysed picks a sequential or
// a bitmap scan of the tenant's rows instead, and a cached generic plan
// keeps it until the next ANALYZE (docs/benchmarks.md, "Measurements
// behind the code"). With both off the planner has only index scans left
// for the lookups, so they read what they answer at any table size and
// any statistics; they change nothing else (nothing here scans).
//
// JIT goes with the scans (pgplan.NoSeqScan): no statement here ever
// repays compiling.
var txSettingsSQL = `set_config('idle_in_transaction_session_timeout', '` + strconv.FormatInt(lockTimeout.Milliseconds(), 10) + `ms', true),
	` + pgplan.NoSeqScan + `,
	set_config('enable_bitmapscan', 'off', true)`

// txSettingsColumns is how many columns txSettingsSQL selects.
const txSettingsColumns = 2 + pgplan.NoSeqScanColumns
