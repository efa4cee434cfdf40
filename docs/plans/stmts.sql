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
\o /dev/null
PREPARE lockCandidates(uuid, int) AS SELECT id, ts, period_start, overage_input_tokens, overage_output_tokens,
  (overage_input_tokens <> 0 AND input_report_lead IS NULL AND input_accepted_at IS NULL), (overage_output_tokens <> 0 AND output_report_lead IS NULL AND output_accepted_at IS NULL),
  first_attempt_at, first_attempt_at IS NOT NULL AND input_report_lead IS NULL AND output_report_lead IS NULL AND meter_leads IS NULL,
  meter_keys, meter_overage, meter_leads, meter_accepted_at
  FROM usage_logs
  WHERE tenant_id = $1 AND billing_status = 'pending' AND ((overage_input_tokens <> 0 AND input_report_lead IS NULL AND input_accepted_at IS NULL) OR (overage_output_tokens <> 0 AND output_report_lead IS NULL AND output_accepted_at IS NULL) OR (meter_keys IS NOT NULL AND EXISTS (
		SELECT 1 FROM unnest(meter_overage, meter_leads, meter_accepted_at) AS x (o, l, a)
		WHERE x.o <> 0 AND x.l IS NULL AND x.a IS NULL)))
  ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED;
PREPARE insertReport(uuid, text, uuid, timestamptz, date, bigint, timestamptz, uuid[], text, timestamptz, float8, float8) AS INSERT INTO usage_reports (lead_usage_log_id, dimension, tenant_id, period_start, usage_day, value, ts,
			member_ids, state, first_attempt_at, lease_until, accepted_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, coalesce($10, now()),
			CASE WHEN $9 = 'open' THEN now() + make_interval(secs => $11) END, CASE WHEN $9 = 'accepted' THEN now() END)
		RETURNING first_attempt_at, extract(epoch FROM first_attempt_at + make_interval(secs => $12) - now())::float8;
PREPARE formMembership(uuid[], uuid[], uuid[], uuid[], int[], int[]) AS UPDATE usage_logs u SET
				input_report_lead = coalesce(v.inl, u.input_report_lead),
				output_report_lead = coalesce(v.outl, u.output_report_lead),
				meter_leads = CASE WHEN v.cnt > 0 THEN ($4::uuid[])[v.off + 1 : v.off + v.cnt] ELSE u.meter_leads END,
				first_attempt_at = coalesce(u.first_attempt_at, now()), updated_at = now()
			FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $5::int[], $6::int[]) AS v (id, inl, outl, off, cnt)
			WHERE u.id = v.id;
PREPARE acceptReport(uuid, text) AS UPDATE usage_reports SET state = 'accepted', accepted_at = now(), lease_until = NULL, message = NULL
				WHERE lead_usage_log_id = $1 AND dimension = $2 AND state IN ('open', 'needs_review')
				RETURNING member_ids;
PREPARE acceptMembers(uuid[], bool[], bool[], uuid[], text[]) AS WITH acc AS (
				SELECT e.id, array_agg(e.k) AS keys FROM unnest($4::uuid[], $5::text[]) AS e (id, k) GROUP BY e.id
			)
			UPDATE usage_logs u SET
				input_accepted_at = CASE WHEN v.i THEN coalesce(u.input_accepted_at, now()) ELSE u.input_accepted_at END,
				meter_accepted_at = CASE WHEN acc.keys IS NULL THEN u.meter_accepted_at ELSE (
					SELECT array_agg(CASE WHEN x.k = ANY (acc.keys) THEN coalesce(x.a, now()) ELSE x.a END ORDER BY x.n)
					FROM unnest(u.meter_keys, u.meter_accepted_at) WITH ORDINALITY AS x (k, a, n)) END,
				billing_status = CASE WHEN u.billing_status IN ('pending', 'needs_review') AND (u.overage_input_tokens = 0 OR u.input_accepted_at IS NOT NULL OR v.i)
		AND (u.overage_output_tokens = 0 OR u.output_accepted_at IS NOT NULL OR v.o)
		AND (u.meter_keys IS NULL OR NOT EXISTS (
			SELECT 1 FROM unnest(u.meter_keys, u.meter_overage, u.meter_accepted_at) AS x (k, o, a)
			WHERE x.o <> 0 AND x.a IS NULL AND NOT (x.k = ANY (coalesce(acc.keys, '{}'))))) THEN 'billed' ELSE u.billing_status END,
				updated_at = now()
			FROM unnest($1::uuid[], $2::bool[], $3::bool[]) AS v (id, i, o) LEFT JOIN acc ON acc.id = v.id
			WHERE u.id = v.id AND u.billing_status = 'pending';
PREPARE closeReport(uuid, text, text, text, text, float8) AS UPDATE usage_reports SET state = $3, lease_until = NULL, message = coalesce(nullif($4::text, ''), $5)
			WHERE lead_usage_log_id = $1 AND dimension = $2 AND state = 'open' AND first_attempt_at < now() - make_interval(secs => $6)
			RETURNING member_ids, message;
PREPARE closeMembers(uuid[], text, text) AS UPDATE usage_logs SET billing_status = $2, billing_message = $3, updated_at = now()
			WHERE id = ANY($1) AND billing_status = 'pending';
PREPARE parkOpen(uuid, text) AS WITH parked AS (
			UPDATE usage_reports SET state = 'needs_review', lease_until = NULL, message = $2
			WHERE tenant_id = $1 AND state = 'open' AND (lease_until IS NULL OR lease_until < now())
			RETURNING member_ids)
		UPDATE usage_logs SET billing_status = 'needs_review', billing_message = $2, updated_at = now()
		WHERE tenant_id = $1 AND id IN (SELECT unnest(member_ids) FROM parked) AND billing_status = 'pending';
PREPARE claim(uuid, float8, int) AS UPDATE usage_reports r SET lease_until = now() + make_interval(secs => $2)
		FROM (SELECT lead_usage_log_id, dimension FROM usage_reports
			WHERE tenant_id = $1 AND state = 'open' AND (lease_until IS NULL OR lease_until < now())
			ORDER BY created_at LIMIT $3 FOR UPDATE SKIP LOCKED) c
		WHERE r.lead_usage_log_id = c.lead_usage_log_id AND r.dimension = c.dimension
			AND (r.lease_until IS NULL OR r.lease_until < now())
		RETURNING r.lead_usage_log_id;
PREPARE release(uuid[], text[]) AS UPDATE usage_reports r SET lease_until = NULL
		FROM unnest($1::uuid[], $2::text[]) AS v (lead, dim)
		WHERE r.lead_usage_log_id = v.lead AND r.dimension = v.dim AND r.state = 'open';
PREPARE heldFor(uuid) AS SELECT extract(epoch FROM min(lease_until) - now())::float8 FROM usage_reports
		WHERE tenant_id = $1 AND state = 'open' AND lease_until > now();
PREPARE expiredReports(int, float8) AS SELECT lead_usage_log_id, dimension, tenant_id, value, ts, member_ids, state, first_attempt_at FROM usage_reports
		WHERE state = 'open' AND first_attempt_at < now() - make_interval(secs => $2)
			AND (lease_until IS NULL OR lease_until < now())
		LIMIT $1;
PREPARE tenantsPendingSince(float8) AS SELECT t.id FROM tenants t WHERE t.suspended_at IS NULL AND EXISTS (
		SELECT 1 FROM usage_logs u WHERE u.tenant_id = t.id AND u.billing_status = 'pending'
			AND u.created_at < now() - make_interval(secs => $1));
PREPARE lockForReview(uuid, float8) AS SELECT billing_status, billing_message, first_attempt_at,
			overage_input_tokens, overage_output_tokens, input_accepted_at, output_accepted_at, input_report_lead, output_report_lead,
			now(), first_attempt_at + make_interval(secs => $2),
			coalesce(first_attempt_at + make_interval(secs => $2) > now(), false)
		FROM usage_logs WHERE id = $1 FOR UPDATE;
PREPARE resolveReports(uuid, text, text) AS UPDATE usage_reports r SET state = $2, lease_until = NULL, message = $3,
			accepted_at = CASE WHEN $2 = 'accepted' THEN now() ELSE r.accepted_at END,
			first_attempt_at = CASE WHEN $2 = 'open' THEN now() ELSE r.first_attempt_at END
		FROM usage_logs u
		WHERE u.id = $1 AND r.state IN ('needs_review', 'failed')
			AND ((r.dimension = 'input' AND r.lead_usage_log_id = u.input_report_lead)
				OR (r.dimension = 'output' AND r.lead_usage_log_id = u.output_report_lead)
				OR EXISTS (SELECT 1 FROM unnest(u.meter_keys, u.meter_leads) AS x (k, l)
					WHERE x.k = r.dimension AND x.l = r.lead_usage_log_id))
		RETURNING r.member_ids;
PREPARE resolveLogs(uuid[], text, text) AS UPDATE usage_logs SET billing_status = $2, billing_message = $3, updated_at = now(),
			billed_at = CASE $2 WHEN 'billed' THEN now() WHEN 'pending' THEN NULL ELSE billed_at END,
			first_attempt_at = CASE WHEN $2 <> 'pending' THEN first_attempt_at
				WHEN input_report_lead IS NULL AND output_report_lead IS NULL AND meter_leads IS NULL THEN NULL ELSE now() END
		WHERE id = ANY($1) AND billing_status IN ('needs_review', 'failed')
		RETURNING id;
PREPARE tenantOf(uuid) AS SELECT tenant_id FROM usage_logs WHERE id = $1;
PREPARE workerTenant(uuid) AS SELECT stripe_customer_id, suspended_at IS NOT NULL FROM tenants WHERE id = $1;
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
PREPARE getLog(uuid) AS SELECT * FROM usage_logs WHERE id = $1;
PREPARE correctionsOf(uuid) AS SELECT * FROM usage_logs WHERE corrects = $1 ORDER BY id;
PREPARE streamRow(uuid, text) AS SELECT sequence, final, input_tokens, output_tokens, closed_at IS NOT NULL, first_usage_log_id
	FROM usage_streams WHERE tenant_id = $1 AND request_id = $2;
PREPARE byRequestID(uuid, text, uuid, int) AS SELECT * FROM usage_logs
		WHERE tenant_id = $1 AND (stream_request_id = $2 OR request_id = $2) AND ($3::uuid IS NULL OR id > $3)
		ORDER BY id LIMIT $4;
\o
