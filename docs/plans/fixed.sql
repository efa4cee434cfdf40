SET statement_timeout = 120000;
-- each block: \set name, PREPARE, two EXPLAINs (custom, generic), DEALLOCATE; writes in BEGIN/ROLLBACK
\pset pager off
\pset tuples_only on
\set ON_ERROR_STOP 0
SELECT coalesce((SELECT tenant_id::text FROM usage_logs WHERE billing_status='pending' AND meter_keys IS NOT NULL LIMIT 1), gen_random_uuid()::text) AS tp \gset
SELECT coalesce((SELECT id::text FROM usage_logs WHERE billing_status='billed' AND meter_keys IS NOT NULL LIMIT 1), gen_random_uuid()::text) AS lid \gset
SELECT coalesce((SELECT lead_usage_log_id::text FROM usage_reports WHERE state='accepted' LIMIT 1), gen_random_uuid()::text) AS rlead \gset
SELECT coalesce((SELECT id::text FROM usage_logs WHERE billing_status='pending' LIMIT 1), gen_random_uuid()::text) AS plid \gset
SELECT coalesce((SELECT request_id FROM usage_logs WHERE tenant_id = :'tp' AND request_id IS NOT NULL LIMIT 1), 'r1') AS rid \gset
\echo TENANT :tp LOG :lid LEAD :rlead PENDINGLOG :plid RID :rid
SELECT lead_usage_log_id::text AS nrlead FROM usage_reports WHERE state='needs_review' LIMIT 1 \gset
SELECT id::text AS nrlog FROM usage_logs WHERE input_report_lead = :'nrlead' LIMIT 1 \gset
\echo NEEDSREVIEW LOG :nrlog
\o /dev/null
PREPARE statusOneTenant(uuid) AS SELECT t.id, t.name, t.stripe_customer_id,
	coalesce(c.usage_logs, 0), coalesce(c.billed, 0), coalesce(c.pending, 0),
	CASE WHEN c.pending > 0 THEN
		(SELECT min(u.created_at) FROM usage_logs u WHERE u.tenant_id = t.id AND u.billing_status = 'pending')
	END
FROM tenants t
LEFT JOIN (
	SELECT b.tenant_id,
		sum(b.usage_logs)::bigint AS usage_logs,
		(sum(b.usage_logs) FILTER (WHERE b.billing_status = 'billed'))::bigint AS billed,
		(sum(b.usage_logs) FILTER (WHERE b.billing_status = 'pending'))::bigint AS pending,
		sum(b.overage_input_tokens)::bigint AS overage_input_tokens
	FROM billing_counters b
	GROUP BY b.tenant_id
) c ON c.tenant_id = t.id
WHERE t.id = $1
ORDER BY t.name, t.id;
PREPARE statusPage(text, uuid, int) AS SELECT t.id, t.name, t.stripe_customer_id,
	coalesce(c.usage_logs, 0), coalesce(c.billed, 0), coalesce(c.pending, 0),
	CASE WHEN c.pending > 0 THEN
		(SELECT min(u.created_at) FROM usage_logs u WHERE u.tenant_id = t.id AND u.billing_status = 'pending')
	END
FROM tenants t
LEFT JOIN (
	SELECT b.tenant_id,
		sum(b.usage_logs)::bigint AS usage_logs,
		(sum(b.usage_logs) FILTER (WHERE b.billing_status = 'billed'))::bigint AS billed,
		(sum(b.usage_logs) FILTER (WHERE b.billing_status = 'pending'))::bigint AS pending,
		sum(b.overage_input_tokens)::bigint AS overage_input_tokens
	FROM billing_counters b
	GROUP BY b.tenant_id
) c ON c.tenant_id = t.id
WHERE $1::text IS NULL OR (t.name, t.id) > ($1, $2::uuid)
ORDER BY t.name, t.id LIMIT $3;
PREPARE totals AS SELECT coalesce(sum(b.usage_logs), 0)::bigint,
	coalesce(sum(b.usage_logs) FILTER (WHERE b.billing_status = 'billed'), 0)::bigint,
	coalesce(sum(b.overage_input_tokens), 0)::bigint,
	(SELECT min(u.created_at) FROM usage_logs u WHERE u.billing_status = 'pending')
FROM billing_counters b;
PREPARE extraMetersAll AS SELECT c.tenant_id, c.meter, m.token_type, sum(c.overage_tokens)::bigint,
	coalesce(sum(c.overage_tokens) FILTER (WHERE c.billing_status = 'billed'), 0)::bigint
FROM meter_counters c JOIN meters m ON m.key = c.meter
GROUP BY 1, 2, 3 HAVING sum(c.overage_tokens) <> 0 ORDER BY 2;
PREPARE extraMetersTenants(uuid[]) AS SELECT c.tenant_id, c.meter, m.token_type, sum(c.overage_tokens)::bigint,
	coalesce(sum(c.overage_tokens) FILTER (WHERE c.billing_status = 'billed'), 0)::bigint
FROM meter_counters c JOIN meters m ON m.key = c.meter
WHERE c.tenant_id = ANY($1)
GROUP BY 1, 2, 3 HAVING sum(c.overage_tokens) <> 0 ORDER BY 2;
PREPARE readBacklog AS SELECT
			coalesce(sum(usage_logs) FILTER (WHERE billing_status = 'pending'), 0)::bigint,
			coalesce(sum(usage_logs) FILTER (WHERE billing_status = 'needs_review'), 0)::bigint,
			(SELECT min(created_at) FROM usage_logs WHERE billing_status = 'pending'),
			now()
		FROM billing_counters;
PREPARE reconcileBilled(timestamptz, timestamptz, timestamptz) AS SELECT t.stripe_customer_id,
			to_char(u.ts AT TIME ZONE 'UTC', 'YYYY-MM-DD'),
			coalesce(sum(u.overage_input_tokens) FILTER (WHERE u.billing_status = 'billed'), 0)::bigint,
			coalesce(sum(u.overage_output_tokens) FILTER (WHERE u.billing_status = 'billed'), 0)::bigint,
			coalesce(bool_or(greatest(u.first_attempt_at, u.input_accepted_at, u.output_accepted_at, u.billed_at) > $3), false)
		FROM usage_logs u JOIN tenants t ON t.id = u.tenant_id
		WHERE u.ts >= $1 AND u.ts < $2 AND u.billing_status NOT IN ('not_billable')
		GROUP BY 1, 2;
PREPARE reconcileBilledTenants(timestamptz, timestamptz, timestamptz, uuid[]) AS SELECT t.stripe_customer_id,
			to_char(u.ts AT TIME ZONE 'UTC', 'YYYY-MM-DD'),
			coalesce(sum(u.overage_input_tokens) FILTER (WHERE u.billing_status = 'billed'), 0)::bigint,
			coalesce(bool_or(greatest(u.first_attempt_at, u.input_accepted_at, u.output_accepted_at, u.billed_at) > $3), false)
		FROM usage_logs u JOIN tenants t ON t.id = u.tenant_id
		WHERE u.ts >= $1 AND u.ts < $2 AND u.billing_status NOT IN ('not_billable') AND u.tenant_id = ANY($4)
		GROUP BY 1, 2;
PREPARE billedOnMeters(timestamptz, timestamptz) AS SELECT t.stripe_customer_id, to_char(u.ts AT TIME ZONE 'UTC', 'YYYY-MM-DD'), x.k, sum(x.o)::bigint
		FROM usage_logs u JOIN tenants t ON t.id = u.tenant_id CROSS JOIN LATERAL unnest(u.meter_keys, u.meter_overage) AS x (k, o)
		WHERE u.ts >= $1 AND u.ts < $2 AND u.meter_keys IS NOT NULL AND u.billing_status = 'billed'
		GROUP BY 1, 2, 3;
PREPARE byRequestID(uuid, text, uuid, int) AS SELECT * FROM usage_logs
		WHERE tenant_id = $1 AND (stream_request_id = $2 OR request_id = $2) AND ($3::uuid IS NULL OR id > $3)
		ORDER BY id LIMIT $4;
PREPARE resolveReportsNew(uuid, text, text) AS UPDATE usage_reports r SET state = $2, lease_until = NULL, message = $3,
			accepted_at = CASE WHEN $2 = 'accepted' THEN now() ELSE r.accepted_at END,
			first_attempt_at = CASE WHEN $2 = 'open' THEN now() ELSE r.first_attempt_at END
		FROM usage_logs u
		CROSS JOIN LATERAL (
			SELECT 'input'::text, u.input_report_lead WHERE u.input_report_lead IS NOT NULL
			UNION ALL SELECT 'output', u.output_report_lead WHERE u.output_report_lead IS NOT NULL
			UNION ALL SELECT x.k, x.l FROM unnest(u.meter_keys, u.meter_leads) AS x (k, l) WHERE x.l IS NOT NULL
		) AS c (dimension, lead)
		WHERE u.id = $1 AND r.lead_usage_log_id = c.lead AND r.dimension = c.dimension
			AND r.state IN ('needs_review', 'failed')
		RETURNING r.member_ids;
\o
\set ex 'EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF)'
SELECT now() - interval '35 days' AS d0, now() - interval '34 days' AS d1 \gset
\echo ===== resolveReports (rewritten), custom plan
\echo ### resolveReportsNew
BEGIN; SET LOCAL plan_cache_mode = force_custom_plan; :ex EXECUTE resolveReportsNew(:'nrlog', 'accepted', 'x'); ROLLBACK;
\echo ===== finance, backlog: custom plans, enable_seqscan off (parameterless: the one generic plan)
BEGIN; SET LOCAL plan_cache_mode = force_custom_plan; SET LOCAL enable_seqscan = off;
\echo ### statusOneTenant
:ex EXECUTE statusOneTenant(:'tp');
\echo ### statusPage
:ex EXECUTE statusPage(NULL, NULL, 51);
\echo ### totals
:ex EXECUTE totals;
\echo ### extraMetersAll
:ex EXECUTE extraMetersAll;
\echo ### extraMetersTenants
:ex EXECUTE extraMetersTenants(ARRAY[:'tp'::uuid]);
\echo ### readBacklog
:ex EXECUTE readBacklog;
\echo ### byRequestID
:ex EXECUTE byRequestID(:'tp', :'rid', NULL, 51);
ROLLBACK;
\echo ===== reconcile: BRIN usage_logs_ts, custom plans, enable_seqscan off, jit off
BEGIN; SET LOCAL plan_cache_mode = force_custom_plan; SET LOCAL enable_seqscan = off; SET LOCAL jit = off;
\echo ### reconcileBilled
:ex EXECUTE reconcileBilled(:'d0', :'d1', now() - interval '1 hour');
\echo ### reconcileBilledTenants
:ex EXECUTE reconcileBilledTenants(:'d0', :'d1', now() - interval '1 hour', ARRAY[:'tp'::uuid]);
\echo ### billedOnMeters
:ex EXECUTE billedOnMeters(:'d0', :'d1');
ROLLBACK;
