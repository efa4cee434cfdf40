package usagelog

// InsertSQL records usage logs: every usage_logs row ingest adds (new
// events, a stream's increases, corrections) goes through it, one row per
// element of its arrays, in request_id order (two transactions sharing
// request_ids then wait for each other instead of deadlocking).
//
// $1 the tenant; per log: $2 id, $3 request_id, $4 ts, $5 user_id,
// $6 model_id, $7 input_tokens, $8 output_tokens, $9 period_start,
// $10 overage_input_tokens, $11 overage_output_tokens, $12 billing_status;
// $13 created_at (the transaction's now()). The rare columns are arrays
// that may be NULL as a whole (then every log's is NULL): $14 to $16 the
// token parts (cache read, cache write, reasoning), $22 whether the log is
// reported at send time (stripe_timestamp 'reported': its period is
// closed), $23 corrects, $24 correction_reason, $25 stream_request_id,
// $26 corrected_by. The lines of the meters other than the defaults are
// flat: $17 each log's meter keys joined by commas (NULL: none), $18 and
// $19 the tokens and overage of every log's lines, $20 and $21 each log's
// offset and count in them.
const InsertSQL = `INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
		period_start, overage_input_tokens, overage_output_tokens, billing_status, created_at, updated_at,
		cache_read_input_tokens, cache_creation_input_tokens, reasoning_output_tokens,
		meter_keys, meter_tokens, meter_overage, stripe_timestamp,
		corrects, correction_reason, stream_request_id, corrected_by)
	SELECT u.id, $1, u.rid, u.ts, u.usr, u.model, u.i, u.o, u.period, u.oi, u.oo, u.status, $13, $13,
		($14::bigint[])[u.n], ($15::bigint[])[u.n], ($16::bigint[])[u.n],
		x.keys, x.tokens, x.over, CASE WHEN ($22::bool[])[u.n] THEN 'reported' END,
		($23::uuid[])[u.n], ($24::text[])[u.n], ($25::text[])[u.n], ($26::text[])[u.n]
	FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::text[], $6::text[], $7::bigint[], $8::bigint[],
		$9::timestamptz[], $10::bigint[], $11::bigint[], $12::text[], $17::text[]) WITH ORDINALITY
		AS u (id, rid, ts, usr, model, i, o, period, oi, oo, status, mk, n)
	LEFT JOIN LATERAL (
		SELECT string_to_array(u.mk, ',') AS keys, ($18::bigint[])[lo:hi] AS tokens, ($19::bigint[])[lo:hi] AS over
		FROM (SELECT ($20::int[])[u.n] + 1 AS lo, ($20::int[])[u.n] + ($21::int[])[u.n] AS hi) AS r
		WHERE ($21::int[])[u.n] > 0) AS x ON true
	ORDER BY u.rid COLLATE "C"`
