package usagelog

import "fmt"

// InsertSQL records usage logs: every usage_logs row ingest adds (new
// events, a stream's increases, corrections) goes through it, one row per
// element of its arrays, in request_id order (two transactions sharing
// request_ids then wait for each other instead of deadlocking). Each row's
// values are columns of one unnest, not subscripts of the arrays.
//
// $1 the tenant; per log: $2 id, $3 request_id, $4 ts, $5 user_id,
// $6 model_id, $7 input_tokens, $8 output_tokens, $9 period_start,
// $10 overage_input_tokens, $11 overage_output_tokens, $12 billing_status;
// $13 created_at (the transaction's now()); updated_at stays NULL until
// the log changes (0068: a new log's updated_at only repeated created_at,
// and its 8 bytes took a batched log's tuple past a MAXALIGN step). The
// rare columns are arrays that may be NULL as a whole (unnest then gives
// every log NULL): $14 to $16 the token parts (cache read, cache write, reasoning), $22 whether
// the log is reported at send time (stripe_timestamp 'reported': its
// period is closed), $23 corrects, $24 correction_reason,
// $25 stream_request_id, $26 corrected_by. The lines of the meters other
// than the defaults are flat: $17 each log's meter keys joined by commas
// (NULL: none), $18 and $19 the tokens and overage of every log's lines,
// $20 and $21 each log's offset and count in them. A log whose every line
// is wholly overage (the common case once an allowance is spent) stores
// meter_tokens NULL: it equals meter_overage, and its 45 bytes were a
// seventh of such a row (MeterTokensSQL reads it back). In the same way
// an overage of the default meters equal to the log's tokens (every log
// once the allowance is spent) is stored NULL (0069): 16 bytes, a batched
// log's tuple from 176 to 160 (OverageInputSQL, OverageOutputSQL read it
// back).
var InsertSQL = fmt.Sprintf(insertSQL, "nullif(u.oi, u.i), nullif(u.oo, u.o)")

// InsertOverageSQL is InsertSQL storing every overage as it is, never
// NULL: for a database without 0069, where the columns are NOT NULL
// (OverageNullSQL tells which). A binary runs only on a database migrated
// for it (app.CheckSchema), so this is for a writer started before the
// migration, as the tests that migrate under load start theirs.
var InsertOverageSQL = fmt.Sprintf(insertSQL, "u.oi, u.oo")

// OverageNullSQL is whether usage_logs takes an overage NULL (0069).
const OverageNullSQL = `SELECT NOT attnotnull FROM pg_attribute
	WHERE attrelid = 'usage_logs'::regclass AND attname = 'overage_input_tokens'`

const insertSQL = `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
		period_start, overage_input_tokens, overage_output_tokens, billing_status, created_at,
		cache_read_input_tokens, cache_creation_input_tokens, reasoning_output_tokens,
		meter_keys, meter_tokens, meter_overage, stripe_timestamp,
		corrects, correction_reason, stream_request_id, corrected_by)
	SELECT u.id, $1, u.rid, u.ts, u.usr, u.model, u.i, u.o, u.period, %s, u.status, $13, u.cr, u.cw, u.rs,
		string_to_array(u.mk, ','),
		CASE WHEN u.cnt > 0 THEN nullif(($18::bigint[])[u.lo + 1 : u.lo + u.cnt], ($19::bigint[])[u.lo + 1 : u.lo + u.cnt]) END,
		CASE WHEN u.cnt > 0 THEN ($19::bigint[])[u.lo + 1 : u.lo + u.cnt] END,
		CASE WHEN u.reported THEN 'reported' END,
		u.corrects, u.reason, u.srid, u.cby
	FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::text[], $6::text[], $7::bigint[], $8::bigint[],
		$9::timestamptz[], $10::bigint[], $11::bigint[], $12::text[], $14::bigint[], $15::bigint[], $16::bigint[],
		$17::text[], $20::int[], $21::int[], $22::bool[], $23::uuid[], $24::text[], $25::text[], $26::text[])
		AS u (id, rid, ts, usr, model, i, o, period, oi, oo, status, cr, cw, rs, mk, lo, cnt, reported, corrects, reason, srid, cby)
	ORDER BY u.rid COLLATE "C"`

// ClaimRequestIDsSQL claims the request_ids in $2 of the tenant $1 in
// usage_log_request_claims when a partition bound is within ClaimWindow of
// now (by the database's clock; otherwise it writes nothing), in
// request_id order, queued right before InsertSQL. Within a partition its
// unique index on request_id (on RequestKeySQL since 0067, on (tenant_id,
// RequestDigestSQL) from 0061, on (tenant_id, request_id) before)
// referees two transactions
// recording one request_id; across a bound the two logs would land in two
// partitions whose indexes never meet, and this primary key referees
// instead: the second transaction waits for the first and, once it has
// committed, fails with a unique violation (23505), after which ingest
// runs its pass again and finds the first one's log (the lookup reads
// every partition kept). Two app servers can mint ids on
// either side of a bound only while the database's clock is near it, by
// less than their clocks' skew. TruncateClaims empties the table past the
// window.
var ClaimRequestIDsSQL = fmt.Sprintf(`INSERT INTO usage_log_request_claims (tenant_id, request_id)
	SELECT $1, r.rid FROM unnest($2::text[]) AS r (rid)
	WHERE r.rid IS NOT NULL AND EXISTS (SELECT FROM usage_log_partition_bounds b
		WHERE b.lower BETWEEN now() - interval '%[1]d seconds' AND now() + interval '%[1]d seconds')
	ORDER BY r.rid COLLATE "C"`, int64(ClaimWindow.Seconds()))
