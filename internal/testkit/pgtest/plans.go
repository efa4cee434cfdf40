package pgtest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Probe is one statement whose reads PlanReads measures: its SQL with
// $n parameters, the EXECUTE arguments ("(...)", empty for none) and the
// settings its code runs first in the statement's transaction ("" for
// none), for example `SELECT set_config('plan_cache_mode', 'force_custom_plan', true)`.
type Probe struct {
	Name, SQL, Args, Settings string
}

// CachePlans prepares each probe on conn (as s0, s1, ...) and executes it
// once under force_generic_plan, in a transaction rolled back, so each
// statement's generic plan is made now, on the tables as they are, and
// cached, as pgx's statement cache and plan_cache_mode auto do after a
// few executions.
func CachePlans(t testing.TB, conn *pgx.Conn, probes []Probe) {
	t.Helper()
	ctx := context.Background()
	for i, p := range probes {
		if _, err := conn.Exec(ctx, fmt.Sprintf("PREPARE s%d AS %s", i, p.SQL)); err != nil {
			t.Fatalf("%s: prepare: %v", p.Name, err)
		}
		inProbeTx(t, conn, p, func(tx pgx.Tx) {
			if _, err := tx.Exec(ctx, fmt.Sprintf("EXECUTE s%d%s", i, p.Args)); err != nil {
				t.Fatalf("%s: execute: %v", p.Name, err)
			}
		})
	}
}

// Reads is what one execution of a probe read: the shared pages its plan
// touched and the rows its filters removed.
type Reads struct {
	Pages, Removed float64
	Plan           string
}

// PlanReads runs each probe cached by CachePlans under EXPLAIN (ANALYZE,
// BUFFERS) with the plan cached earlier (plan_cache_mode
// force_generic_plan, as auto would choose it, unless the probe's settings
// say otherwise), in a transaction rolled back, and returns what each read.
// A probe compiled by JIT fails the test.
func PlanReads(t testing.TB, conn *pgx.Conn, probes []Probe) []Reads {
	t.Helper()
	ctx := context.Background()
	out := make([]Reads, len(probes))
	for i, p := range probes {
		inProbeTx(t, conn, p, func(tx pgx.Tx) {
			var raw []byte
			if err := tx.QueryRow(ctx, fmt.Sprintf("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE s%d%s", i, p.Args)).Scan(&raw); err != nil {
				t.Fatalf("%s: explain: %v", p.Name, err)
			}
			var plan []map[string]any
			if err := json.Unmarshal(raw, &plan); err != nil {
				t.Fatal(err)
			}
			// A disabled scan the plan cannot avoid is costed at 10^10, far
			// above jit_above_cost, and a statement compiled by JIT spends
			// tens of milliseconds compiling what runs in one: settings
			// that turn a scan off must turn JIT off too.
			if jit, ok := plan[0]["JIT"].(map[string]any); ok {
				t.Errorf("%s: compiled by JIT (%v functions): its settings turn a scan off but leave jit on", p.Name, jit["Functions"])
			}
			top := plan[0]["Plan"].(map[string]any)
			text, _ := json.MarshalIndent(top, "", "  ")
			out[i] = Reads{
				Pages:   top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64),
				Removed: RowsRemoved(top),
				Plan:    string(text),
			}
		})
	}
	return out
}

func inProbeTx(t testing.TB, conn *pgx.Conn, p Probe, f func(pgx.Tx)) {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	if p.Settings != "" {
		if _, err := tx.Exec(ctx, p.Settings); err != nil {
			t.Fatalf("%s: settings: %v", p.Name, err)
		}
	}
	f(tx)
}

// RowsRemoved sums the rows a plan's filters and join filters removed,
// over every node, loops included.
func RowsRemoved(node map[string]any) float64 {
	var n float64
	loops, _ := node["Actual Loops"].(float64)
	if loops == 0 {
		loops = 1
	}
	for _, k := range []string{"Rows Removed by Filter", "Rows Removed by Join Filter", "Rows Removed by Index Recheck"} {
		if v, ok := node[k].(float64); ok {
			n += v * loops
		}
	}
	if kids, ok := node["Plans"].([]any); ok {
		for _, k := range kids {
			n += RowsRemoved(k.(map[string]any))
		}
	}
	return n
}
