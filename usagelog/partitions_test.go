package usagelog_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage/internal/testkit/parttest"
	"github.com/overage-billing/overage/internal/testkit/pgtest"
	"github.com/overage-billing/overage/usagelog"
)

func TestIDFloorIsTheSmallestIDOfItsMillisecond(t *testing.T) {
	t.Parallel()
	at := time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC)
	if got := usagelog.IDFloor(at).String(); got != "01a36e30-f800-0000-0000-000000000000" {
		t.Errorf("IDFloor(%v) = %s", at, got)
	}
	before := time.Now().Truncate(time.Millisecond)
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	if floor := usagelog.IDFloor(before); strings.Compare(id.String(), floor.String()) < 0 {
		t.Errorf("an id minted at or after %v (%s) is below its floor %s", before, id, floor)
	}
	if got := usagelog.IDTime(id); got.Before(before) || got.After(time.Now()) {
		t.Errorf("IDTime(%s) = %v, minted from %v on", id, got, before)
	}
	if got := usagelog.IDTime(usagelog.IDFloor(at)); !got.Equal(at) {
		t.Errorf("IDTime(IDFloor(%v)) = %v", at, got)
	}
}

// A fresh database has one partition of each table, everything before the
// month after next (migration 0054's bound, from when the database was
// made); EnsurePartitions adds the months from there to Ahead months
// beyond the current one, once, each with its usage_reports partition of
// the same range, one after another without a gap.
func TestEnsurePartitionsMakesTheMonthsAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	ps, err := usagelog.Partitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	// The test template may be up to a day old: its bound is two months
	// after the month it was made in.
	if len(ps) != 1 || ps[0].Name != "usage_logs_legacy" || ps[0].Reports != "usage_reports_legacy" || ps[0].Lower != nil ||
		!(ps[0].Upper.Equal(parttest.Month(now, 2)) || ps[0].Upper.Equal(parttest.Month(now.Add(-24*time.Hour), 2))) {
		t.Fatalf("partitions of a fresh database: %+v", ps)
	}
	created, err := usagelog.EnsurePartitions(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(created) == 0 || created[len(created)-1] != "usage_logs_p"+parttest.Month(now, usagelog.Ahead).Format("200601") {
		t.Fatalf("created %v; want the months to %v", created, parttest.Month(now, usagelog.Ahead))
	}
	again, err := usagelog.EnsurePartitions(ctx, pool)
	if err != nil || len(again) != 0 {
		t.Fatalf("a second run created %v (%v); want none", again, err)
	}
	if ps, err = usagelog.Partitions(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1+len(created) || !ps[len(ps)-1].Upper.Equal(parttest.Month(now, usagelog.Ahead+1)) {
		t.Fatalf("partitions %+v after creating %v", ps, created)
	}
	for i, p := range ps[1:] {
		if p.Lower == nil || !p.Lower.Equal(ps[i].Upper) || p.Reports != strings.Replace(p.Name, "usage_logs_", "usage_reports_", 1) ||
			*p.LowerID != usagelog.IDFloor(*p.Lower) || p.UpperID != usagelog.IDFloor(p.Upper) {
			t.Errorf("partition %+v follows %+v", p, ps[i])
		}
	}
	var bounds int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_log_partition_bounds`).Scan(&bounds); err != nil || bounds != len(ps) {
		t.Errorf("%d bounds recorded (%v) for %d partitions", bounds, err, len(ps))
	}
}

// insertLogSQL records a log of the tenant $1 under the request_id $3 with
// the id $2: the columns a log cannot go without.
const insertLogSQL = `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
		period_start, overage_input_tokens, overage_output_tokens, billing_status)
	VALUES ($2, $1, $3, now(), 'u', 'm', 1, 1, date_trunc('month', now(), 'UTC'), 0, 0, 'not_billable')`

// idAt is an id minted at t.
func idAt(t time.Time) uuid.UUID {
	id := uuid.New()
	floor := usagelog.IDFloor(t)
	copy(id[:6], floor[:6])
	return id
}

// Across the bound of two partitions, whose unique indexes on request_id
// never meet, the claim referees: of two transactions recording one
// request_id on either side of a bound near now, the second waits for the
// first and fails once it commits. Far from any bound nothing is claimed,
// and the same two transactions both record (the control: the claims are
// what referees). Within one partition, its unique index does.
func TestRequestIDClaimsRefereeAcrossABound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	bound := now.Add(10 * time.Minute)
	names := parttest.Repartition(t, pool, parttest.Month(now, -1), bound, parttest.Month(now, 2))
	tenant := uuid.New()

	// race runs the claim and insert of rid with id a in one transaction
	// and, once that holds them, with id b in another; then commits the
	// first and returns the second's outcome.
	race := func(rid string, a, b uuid.UUID) error {
		t.Helper()
		first, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = first.Rollback(ctx) }()
		for _, q := range []struct {
			sql  string
			args []any
		}{{usagelog.ClaimRequestIDsSQL, []any{tenant, []string{rid}}}, {insertLogSQL, []any{tenant, a, rid}}} {
			if _, err := first.Exec(ctx, q.sql, q.args...); err != nil {
				t.Fatalf("first transaction: %v", err)
			}
		}
		done := make(chan error, 1)
		go func() {
			done <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, usagelog.ClaimRequestIDsSQL, tenant, []string{rid}); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, insertLogSQL, tenant, b, rid)
				return err
			})
		}()
		select {
		case err := <-done:
			return fmt.Errorf("the second transaction did not wait for the first: %w", err)
		case <-time.After(300 * time.Millisecond):
			// Waiting (or, without a referee, done and waiting to be read).
		}
		if err := first.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return <-done
	}
	uniqueOn := func(err error) string {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			return pgErr.ConstraintName
		}
		return ""
	}
	logsOf := func(rid string) int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_logs WHERE tenant_id = $1 AND request_id = $2`, tenant, rid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	err := race("across", idAt(bound.Add(-time.Millisecond)), idAt(bound))
	if uniqueOn(err) != "usage_log_request_claims_pkey" || logsOf("across") != 1 {
		t.Errorf("two transactions recording one request_id across the bound: the second got %v, %d logs; want the claim's unique violation, one log",
			err, logsOf("across"))
	}
	// Far from any bound (the bound's row moved a day away, as if it were
	// a month off), nothing is claimed: within one partition its unique
	// index referees, and across the bound — the control — nothing does.
	if _, err := pool.Exec(ctx, `UPDATE usage_log_partition_bounds SET lower = lower + interval '1 day' WHERE lower = $1`, bound); err != nil {
		t.Fatal(err)
	}
	err = race("within", idAt(bound.Add(-2*time.Millisecond)), idAt(bound.Add(-time.Millisecond)))
	if uniqueOn(err) != names[0]+usagelog.RequestKeyIndexSuffix || logsOf("within") != 1 {
		t.Errorf("within one partition: the second got %v, %d logs; want the violation of %s_request_key, one log", err, logsOf("within"), names[0])
	}
	if err := race("unrefereed", idAt(bound.Add(-time.Millisecond)), idAt(bound)); err != nil || logsOf("unrefereed") != 2 {
		t.Errorf("across the bound with nothing claimed: %v, %d logs; want both recorded (else the control cannot fail)", err, logsOf("unrefereed"))
	}
}

// TruncateClaims empties the claims once no bound is within two windows
// of now, and leaves them while one is.
func TestTruncateClaimsOnlyFarFromABound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	bound := now.Add(-90 * time.Minute)
	parttest.Repartition(t, pool, parttest.Month(now, -1), bound, parttest.Month(now, 2))
	if _, err := pool.Exec(ctx, `INSERT INTO usage_log_request_claims VALUES ($1, 'r')`, uuid.New()); err != nil {
		t.Fatal(err)
	}
	claims := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM usage_log_request_claims`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if done, err := usagelog.TruncateClaims(ctx, pool); err != nil || done || claims() != 1 {
		t.Fatalf("90 minutes after a bound: truncated %v (%v), %d claims left; want them kept", done, err, claims())
	}
	if _, err := pool.Exec(ctx, `UPDATE usage_log_partition_bounds SET lower = lower - interval '1 hour' WHERE lower = $1`, bound); err != nil {
		t.Fatal(err)
	}
	if done, err := usagelog.TruncateClaims(ctx, pool); err != nil || !done || claims() != 0 {
		t.Fatalf("150 minutes after a bound: truncated %v (%v), %d claims left; want none", done, err, claims())
	}
	if done, err := usagelog.TruncateClaims(ctx, pool); err != nil || done {
		t.Fatalf("no claims: truncated %v (%v); want nothing done", done, err)
	}
}

// Every lookup by id reads the partition of the id only, from every
// partition, with a generic plan; the lookups by request_id read every
// partition kept (a request_id is deduplicated as long as its log is
// kept), a year of them, each by an index probe on the whole key of the
// unique index it has — (tenant_id, request_id) on a partition made before
// 0061, (tenant_id, md5(request_id)::uuid) from 0061, the digest of tenant
// and request_id alone since 0067 — with a generic plan and a custom one,
// and find a log in any of them.
func TestLookupsReadOnlyThePartitionsTheirLogsCanBeIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	now := time.Now().UTC()
	var bounds []time.Time
	for m := -13; m <= usagelog.Ahead+1; m++ {
		bounds = append(bounds, parttest.Month(now, m))
	}
	names := parttest.Repartition(t, pool, bounds...)
	// The partitions older than six months made before 0061, with their
	// unique index on the request_id itself; then until two months ago
	// before 0067, with 0061's; since, with AddPartition's.
	const keyed, digested = 6, 11
	shape := func(part string) parttest.IndexShape {
		i := slices.Index(names, part)
		switch {
		case i < 0:
			t.Fatalf("no partition %s", part)
		case i < keyed:
			return parttest.RequestIDIndex
		case i < digested:
			return parttest.DigestIndex
		}
		return parttest.KeyIndex
	}
	for _, name := range names[:digested] {
		parttest.Reindex(t, pool, name, shape(name))
	}
	// The index of each shape and what its index condition shows.
	indexOf := func(part string) (index, key string) {
		switch shape(part) {
		case parttest.RequestIDIndex:
			return part + usagelog.RequestIDIndexSuffix, "tenant_id = "
		case parttest.DigestIndex:
			return part + usagelog.RequestDigestIndexSuffix, "md5(request_id)"
		}
		return part + usagelog.RequestKeyIndexSuffix, "md5(((tenant_id)::text || request_id))"
	}
	tenant := uuid.New()
	// A log in each partition, recorded half way through its month (the
	// current month's: now), under request_id "r<i>", and three more of
	// the tenant's beside it, so that a probe on the tenant alone would
	// read rows.
	var ids []uuid.UUID
	for i := range names {
		at := bounds[i].Add(bounds[i+1].Sub(bounds[i]) / 2)
		if now.After(bounds[i]) && now.Before(bounds[i+1]) {
			at = now
		}
		id := idAt(at)
		if _, err := pool.Exec(ctx, insertLogSQL, tenant, id, fmt.Sprintf("r%d", i)); err != nil {
			t.Fatal(err)
		}
		for j := range 3 {
			if _, err := pool.Exec(ctx, insertLogSQL, tenant, idAt(at), fmt.Sprintf("other%d-%d", i, j)); err != nil {
				t.Fatal(err)
			}
		}
		ids = append(ids, id)
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	explain := func(name, args string) string {
		t.Helper()
		var b strings.Builder
		rows, err := conn.Query(ctx, fmt.Sprintf(`EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE %s%s`, name, args))
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lines {
			b.WriteString(l + "\n")
		}
		return b.String()
	}
	// Partitions read: scans not marked never executed.
	read := func(plan string) []string {
		var out []string
		for _, l := range strings.Split(plan, "\n") {
			if strings.Contains(l, " on usage_logs_p") && !strings.Contains(l, "never executed") {
				out = append(out, strings.Fields(l[strings.Index(l, " on usage_logs_p")+4:])[0])
			}
		}
		return out
	}
	// probedByKey reports whether every partition of the plan is read by
	// its unique index on request_id, on the whole key (tenant and
	// request_id or its digest in the index condition), and by nothing
	// else: no sequential scan, no scan of another index.
	probedByKey := func(plan string) error {
		lines := strings.Split(plan, "\n")
		for i, l := range lines {
			if strings.Contains(l, "Seq Scan") {
				return fmt.Errorf("a sequential scan: %s", l)
			}
			j := strings.Index(l, "Index Scan using usage_logs_p")
			if j < 0 {
				continue
			}
			index := strings.Fields(l[j+len("Index Scan using "):])[0]
			cut := strings.LastIndex(index, "_request")
			if cut < 0 {
				return fmt.Errorf("read by %s, not an index on request_id", index)
			}
			part := index[:cut]
			want, key := indexOf(part)
			if index != want {
				return fmt.Errorf("%s read by %s, want %s", part, index, want)
			}
			// The whole key: the tenant and the request_id, or the
			// digest of the request_id, or the digest of both.
			if i+1 >= len(lines) || !strings.Contains(lines[i+1], "Index Cond") || !strings.Contains(lines[i+1], key) ||
				(shape(part) == parttest.RequestIDIndex && !strings.Contains(lines[i+1], "request_id = ")) ||
				(shape(part) == parttest.DigestIndex && !strings.Contains(lines[i+1], "tenant_id = ")) {
				return fmt.Errorf("%s probed without the whole key: %s", part, lines[i+1])
			}
		}
		return nil
	}
	for _, q := range []string{
		`PREPARE byrid(uuid, text[]) AS ` + usagelog.LogsByRequestIDSQL,
		`PREPARE plain(uuid, text) AS ` + usagelog.PlainLogByRequestIDSQL,
		`PREPARE page(uuid, text, uuid, int) AS ` + usagelog.ByRequestIDSQL,
		`PREPARE byid(uuid) AS ` + usagelog.GetLogSQL,
		`PREPARE byids(uuid[]) AS ` + usagelog.LogsByIDSQL,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var rids []string
	for i := range names {
		rids = append(rids, fmt.Sprintf("r%d", i))
	}
	for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
		if _, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode); err != nil {
			t.Fatal(err)
		}
		if mode == "force_generic_plan" {
			for i, id := range ids {
				plan := explain("byid", fmt.Sprintf("('%s')", id))
				if got := read(plan); len(got) != 1 || got[0] != names[i] || !strings.Contains(plan, "rows=1 ") {
					t.Errorf("GET of the log in %s read %v:\n%s", names[i], got, plan)
				}
			}
			var all []string
			for _, id := range ids {
				all = append(all, id.String())
			}
			plan := explain("byids", fmt.Sprintf("('{%s}')", strings.Join(all, ",")))
			if !strings.Contains(plan, fmt.Sprintf("Nested Loop (actual rows=%d ", len(ids))) || strings.Contains(plan, "loops=2") {
				t.Errorf("the logs of %d ids, one in each partition: want each partition probed once\n%s", len(ids), plan)
			}
		}
		// A request_id found nowhere is probed in every partition.
		plan := explain("byrid", fmt.Sprintf("('%s', '{missing}')", tenant))
		if got := read(plan); strings.Join(got, " ") != strings.Join(names, " ") {
			t.Errorf("%s: the lookup of a request_id recorded nowhere read %v; want every partition %v\n%s", mode, got, names, plan)
		}
		if err := probedByKey(plan); err != nil {
			t.Errorf("%s: the lookup of earlier logs: %v\n%s", mode, err, plan)
		}
		plan = explain("plain", fmt.Sprintf("('%s', 'missing')", tenant))
		if got := read(plan); strings.Join(got, " ") != strings.Join(names, " ") {
			t.Errorf("%s: the plain log of a request_id recorded nowhere read %v; want every partition\n%s", mode, got, plan)
		}
		if err := probedByKey(plan); err != nil {
			t.Errorf("%s: the plain log by request_id: %v\n%s", mode, err, plan)
		}
		// The GET by request_id (always a custom plan: readTx): the stream
		// index or the request_id's in each partition, never a scan.
		plan = explain("page", fmt.Sprintf("('%s', 'missing', NULL, 100)", tenant))
		for _, name := range names {
			if mode != "force_custom_plan" {
				break
			}
			index, _ := indexOf(name)
			if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "Bitmap Index Scan on "+index+" ") {
				t.Errorf("%s: the GET by request_id reads %s without %s\n%s", mode, name, index, plan)
				break
			}
		}
		rows, err := conn.Query(ctx, `EXECUTE byrid('`+tenant.String()+`', '{`+strings.Join(rids, ",")+`}')`)
		if err != nil {
			t.Fatal(err)
		}
		found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			v, err := r.Values() // LogColumns: id, tenant_id, request_id, …
			if err != nil {
				return "", err
			}
			return fmt.Sprint(v[2]), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(found, " ") != strings.Join(rids, " ") {
			t.Errorf("%s: the lookup found the logs of %v; want %v, one in each partition", mode, found, rids)
		}
		for i, rid := range rids {
			rows, err := conn.Query(ctx, `EXECUTE plain('`+tenant.String()+`', '`+rid+`')`)
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (any, error) {
				v, err := r.Values()
				if err != nil {
					return nil, err
				}
				return v[0], nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || fmt.Sprintf("%x", got[0]) != fmt.Sprintf("%x", [16]byte(ids[i])) {
				t.Errorf("%s: the plain log of %s (in %s) read %v; want %s", mode, rid, names[i], got, ids[i])
			}
		}
	}
}

// A new database's first partitions span months ahead of its migration:
// while they hold nothing, FitFirstPartition ends them where the current
// month begins and makes the months from there, so a log recorded now goes
// to its month's partition; a second run does nothing. First partitions
// that hold a log stay as they are — also when the log's transaction was
// still open as the fit came: the fit waits for it behind its lock, then
// finds the log.
func TestFitFirstPartitionEndsEmptyFirstPartitionsAtTheMonth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	var month time.Time
	if err := pool.QueryRow(ctx, `SELECT date_trunc('month', now(), 'UTC')`).Scan(&month); err != nil {
		t.Fatal(err)
	}
	month = month.UTC()
	fitted, created, err := usagelog.FitFirstPartition(ctx, pool)
	if err != nil || !fitted || len(created) != usagelog.Ahead+1 || created[0] != "usage_logs_p"+month.Format("200601") {
		t.Fatalf("fit = %v, created %v, %v; want the first partitions ended and the months from %v made", fitted, created, err, month)
	}
	ps, err := usagelog.Partitions(ctx, pool)
	if err != nil || ps[0].Name != "usage_logs_legacy" || ps[0].Reports != "usage_reports_legacy" || ps[0].Lower != nil || !ps[0].Upper.Equal(month) {
		t.Fatalf("first partition after the fit: %+v (%v); want it ending at %v", ps[0], err, month)
	}
	for i, p := range ps[1:] {
		if p.Lower == nil || !p.Lower.Equal(ps[i].Upper) || p.Reports == "" {
			t.Fatalf("partition %+v does not follow %+v", p, ps[i])
		}
	}
	tenant := uuid.New()
	if _, err := pool.Exec(ctx, insertLogSQL, tenant, idAt(time.Now()), "r1"); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM usage_logs`).Scan(&got); err != nil || got != created[0] {
		t.Fatalf("a log recorded now went to %s (%v), want %s", got, err, created[0])
	}
	if fitted, created, err := usagelog.FitFirstPartition(ctx, pool); err != nil || fitted || len(created) != 0 {
		t.Fatalf("second fit = %v, created %v, %v; want nothing", fitted, created, err)
	}

	// A log in the first partition, its transaction open as the fit comes.
	held, _ := pgtest.NewPool(t)
	tx, err := held.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, insertLogSQL, tenant, idAt(time.Now()), "r1"); err != nil {
		t.Fatal(err)
	}
	type fit struct {
		fitted bool
		err    error
	}
	done := make(chan fit, 1)
	go func() {
		fitted, _, err := usagelog.FitFirstPartition(ctx, held)
		done <- fit{fitted, err}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := held.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE NOT granted AND mode = 'AccessExclusiveLock'
				AND relation = 'usage_logs_legacy'::regclass)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the fit to wait for the open transaction's lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.fitted {
		t.Fatalf("fit over a committed log = %v, %v; want no fit", r.fitted, r.err)
	}
	after, err := usagelog.Partitions(ctx, held)
	if err != nil || after[0].Lower != nil || !after[0].Upper.After(month) {
		t.Fatalf("first partition holding a log: %+v (%v); want it left spanning months ahead", after[0], err)
	}
	var n int
	if err := held.QueryRow(ctx, `SELECT count(*) FROM usage_logs_legacy`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("first partition holds %d logs (%v), want the 1 committed", n, err)
	}
}
