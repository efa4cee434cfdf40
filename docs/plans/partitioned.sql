-- The statements whose plans the partitioning of usage_logs and
-- usage_reports (0054-0059) changed, on a partitioned layout: a database
-- migrated by `overage migrate`, its (empty) partitions replaced by
-- the months from four months ago to two ahead (what months of ingest
-- leave), 1,000,000 logs over the last 90 days (ids UUIDv7 of their time)
-- and a report of every 32nd, some open. Run:
--   psql "$URL" -f docs/plans/partitioned.sql > docs/plans/G_partitioned.txt
\set ON_ERROR_STOP on
\pset pager off
SET client_min_messages = warning;
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT inhparent::regclass::text AS parent, inhrelid::regclass::text AS part FROM pg_inherits
        WHERE inhparent IN ('usage_logs'::regclass, 'usage_reports'::regclass)
    LOOP
        EXECUTE format('ALTER TABLE %s DETACH PARTITION %s', r.parent, r.part);
        EXECUTE format('DROP TABLE %s', r.part);
    END LOOP;
END
$$;
DO $$
DECLARE
    m timestamptz;
    s text;
BEGIN
    FOR m IN SELECT generate_series(date_trunc('month', now(), 'UTC') - interval '4 months', date_trunc('month', now(), 'UTC') + interval '2 months', interval '1 month') LOOP
        s := to_char(m AT TIME ZONE 'UTC', 'YYYYMM');
        EXECUTE format('CREATE TABLE usage_logs_p%s (LIKE usage_logs INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION) WITH (fillfactor = 80)', s);
        EXECUTE format('CREATE UNIQUE INDEX usage_logs_p%s_request_id ON usage_logs_p%s (tenant_id, request_id) WHERE request_id IS NOT NULL', s, s);
        EXECUTE format('ALTER TABLE usage_logs ATTACH PARTITION usage_logs_p%s FOR VALUES FROM (%L) TO (%L)', s,
            (lpad(to_hex(floor(extract(epoch FROM m) * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid,
            (lpad(to_hex(floor(extract(epoch FROM m + interval '1 month') * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid);
        EXECUTE format('CREATE TABLE usage_reports_p%s (LIKE usage_reports INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION)', s);
        EXECUTE format('ALTER TABLE usage_reports ATTACH PARTITION usage_reports_p%s FOR VALUES FROM (%L) TO (%L)', s,
            (lpad(to_hex(floor(extract(epoch FROM m) * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid,
            (lpad(to_hex(floor(extract(epoch FROM m + interval '1 month') * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid);
        INSERT INTO usage_log_partition_bounds VALUES (m) ON CONFLICT DO NOTHING;
    END LOOP;
END
$$;
INSERT INTO tenants (id, name, stripe_customer_id)
SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(n), 12, '0'))::uuid, 'tenant ' || n, 'cus_' || n FROM generate_series(0, 99) n;
INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens, period_start,
  overage_input_tokens, overage_output_tokens, billing_status, created_at, updated_at)
SELECT (lpad(to_hex(floor(extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7' || lpad(to_hex(g % 4096), 3, '0') || '8' || lpad(to_hex(g), 15, '0'))::uuid,
  ('00000000-0000-4000-8000-' || lpad(to_hex(g % 100), 12, '0'))::uuid, 'r' || g, t, 'u', 'm', 100, 50, date_trunc('month', t, 'UTC'),
  10, 5, CASE WHEN g % 3333 = 0 THEN 'pending' ELSE 'billed' END, t, t
FROM (SELECT g, now() - interval '90 days' * (1 - g / 1000000.0) AS t FROM generate_series(1, 1000000) g) s;
INSERT INTO usage_reports (lead_usage_log_id, dimension, tenant_id, period_start, usage_day, value, ts, member_ids, state, first_attempt_at, created_at)
SELECT id, 'input', tenant_id, period_start, ts::date, 10, ts, ARRAY[id], CASE WHEN request_id ~ '00$' THEN 'open' ELSE 'accepted' END, ts, ts
FROM usage_logs WHERE request_id ~ '(00|32|64|96)$';
VACUUM ANALYZE usage_logs, usage_reports;
SELECT (SELECT id FROM usage_logs WHERE request_id = 'r500000') AS mid, (SELECT id FROM usage_logs WHERE request_id = 'r999999') AS new,
  '00000000-0000-4000-8000-' || lpad(to_hex(1), 12, '0') AS tp \gset
PREPARE getLog(uuid) AS SELECT id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
	cache_read_input_tokens, cache_creation_input_tokens, reasoning_output_tokens,
	overage_input_tokens, overage_output_tokens, billing_status, billed_at, created_at,
	first_attempt_at, billing_message, input_accepted_at, output_accepted_at, input_report_lead, output_report_lead,
	corrects, correction_reason, meter_keys, meter_tokens, meter_overage, meter_leads, meter_accepted_at, corrected_by,
	coalesce(stripe_timestamp, 'usage') FROM usage_logs WHERE id = $1;
PREPARE logsByID(uuid[]) AS SELECT id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
	cache_read_input_tokens, cache_creation_input_tokens, reasoning_output_tokens,
	overage_input_tokens, overage_output_tokens, billing_status, billed_at, created_at,
	first_attempt_at, billing_message, input_accepted_at, output_accepted_at, input_report_lead, output_report_lead,
	corrects, correction_reason, meter_keys, meter_tokens, meter_overage, meter_leads, meter_accepted_at, corrected_by,
	coalesce(stripe_timestamp, 'usage') FROM unnest($1::uuid[]) AS k (kid)
	CROSS JOIN LATERAL (SELECT * FROM usage_logs l WHERE l.id = k.kid LIMIT 1) AS u;
PREPARE logsByRequestID(uuid, text[]) AS SELECT id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
	cache_read_input_tokens, cache_creation_input_tokens, reasoning_output_tokens,
	overage_input_tokens, overage_output_tokens, billing_status, billed_at, created_at,
	first_attempt_at, billing_message, input_accepted_at, output_accepted_at, input_report_lead, output_report_lead,
	corrects, correction_reason, meter_keys, meter_tokens, meter_overage, meter_leads, meter_accepted_at, corrected_by,
	coalesce(stripe_timestamp, 'usage')
	FROM unnest($2::text[]) AS r (rid)
	CROSS JOIN LATERAL (
		SELECT * FROM usage_logs l WHERE l.tenant_id = $1 AND l.request_id = r.rid AND l.id >= (SELECT CASE WHEN f.lower IS NULL OR f.lower = '-infinity' THEN '00000000-0000-0000-0000-000000000000'::uuid
			ELSE (lpad(to_hex(floor(extract(epoch FROM f.lower) * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid END
		FROM (SELECT max(b.lower) AS lower FROM usage_log_partition_bounds b WHERE b.lower <= now() - interval '3027900 seconds') AS f) LIMIT 1) AS u;
PREPARE plainLogByRequestID(uuid, text) AS SELECT id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
	cache_read_input_tokens, cache_creation_input_tokens, reasoning_output_tokens,
	overage_input_tokens, overage_output_tokens, billing_status, billed_at, created_at,
	first_attempt_at, billing_message, input_accepted_at, output_accepted_at, input_report_lead, output_report_lead,
	corrects, correction_reason, meter_keys, meter_tokens, meter_overage, meter_leads, meter_accepted_at, corrected_by,
	coalesce(stripe_timestamp, 'usage') FROM usage_logs
	WHERE tenant_id = $1 AND request_id = $2 AND stream_request_id IS NULL AND id >= (SELECT CASE WHEN f.lower IS NULL OR f.lower = '-infinity' THEN '00000000-0000-0000-0000-000000000000'::uuid
			ELSE (lpad(to_hex(floor(extract(epoch FROM f.lower) * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid END
		FROM (SELECT max(b.lower) AS lower FROM usage_log_partition_bounds b WHERE b.lower <= now() - interval '3027900 seconds') AS f);
PREPARE byRequestID(uuid, text, uuid, int) AS SELECT id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
	cache_read_input_tokens, cache_creation_input_tokens, reasoning_output_tokens,
	overage_input_tokens, overage_output_tokens, billing_status, billed_at, created_at,
	first_attempt_at, billing_message, input_accepted_at, output_accepted_at, input_report_lead, output_report_lead,
	corrects, correction_reason, meter_keys, meter_tokens, meter_overage, meter_leads, meter_accepted_at, corrected_by,
	coalesce(stripe_timestamp, 'usage') FROM usage_logs
		WHERE tenant_id = $1 AND (stream_request_id = $2 OR request_id = $2) AND ($3::uuid IS NULL OR id > $3)
		ORDER BY id LIMIT $4;
PREPARE claimRequestIDs(uuid, text[]) AS INSERT INTO usage_log_request_claims (tenant_id, request_id)
	SELECT $1, r.rid FROM unnest($2::text[]) AS r (rid)
	WHERE r.rid IS NOT NULL AND EXISTS (SELECT FROM usage_log_partition_bounds b
		WHERE b.lower BETWEEN now() - interval '3600 seconds' AND now() + interval '3600 seconds')
	ORDER BY r.rid COLLATE "C";
PREPARE claim(uuid, float8, int) AS WITH c AS (SELECT tableoid AS t, ctid AS c FROM usage_reports
			WHERE tenant_id = $1 AND state = 'open' AND (lease_until IS NULL OR lease_until < now())
			ORDER BY created_at LIMIT $3 FOR UPDATE SKIP LOCKED)
	UPDATE usage_reports r SET lease_until = now() + make_interval(secs => $2)
		WHERE r.ctid = ANY (ARRAY(SELECT c.c FROM c)) AND (r.tableoid, r.ctid) IN (SELECT c.t, c.c FROM c)
			AND (r.lease_until IS NULL OR r.lease_until < now())
		RETURNING r.lead_usage_log_id;
PREPARE closeMembers(uuid[], text, text) AS UPDATE usage_logs SET billing_status = $2, billing_message = $3, updated_at = now()
			WHERE id = ANY($1) AND billing_status = 'pending';
\set ex 'EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF)'
\echo ===== the statements of ingest, generic plans (as ingest runs them)
SET plan_cache_mode = force_generic_plan;
\echo ### getLog (GET of one log)
:ex EXECUTE getLog(:'mid');
\echo ### logsByID (the logs of stored answers: two ids, two months)
:ex EXECUTE logsByID(ARRAY[:'mid', :'new']::uuid[]);
\echo ### logsByRequestID (earlier logs of the request_ids: one now, one 45 days old, one absent)
:ex EXECUTE logsByRequestID(:'tp', '{r999901,r500001,absent}');
\echo ### plainLogByRequestID
:ex EXECUTE plainLogByRequestID(:'tp', 'r999901');
\echo ### claimRequestIDs (no bound within an hour: inserts nothing)
BEGIN; :ex EXECUTE claimRequestIDs(:'tp', '{r1,r2}'); ROLLBACK;
\echo ===== the statements of the report store and of GET, custom plans (force_custom_plan, as they run)
SET plan_cache_mode = force_custom_plan;
\echo ### byRequestID (GET /v1/usage-events?request_id=)
:ex EXECUTE byRequestID(:'tp', 'r999901', NULL, 51);
\echo ### claim (open reports of a tenant)
BEGIN; :ex EXECUTE claim(:'tp', 60, 100); ROLLBACK;
\echo ### closeMembers (the members of a report, id = ANY of an array)
BEGIN; :ex EXECUTE closeMembers(ARRAY[:'mid', :'new']::uuid[], 'failed', 'x'); ROLLBACK;
