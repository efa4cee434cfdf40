\timing on
ALTER TABLE usage_logs SET (autovacuum_enabled = off);
ALTER TABLE usage_reports SET (autovacuum_enabled = off);
ALTER TABLE tenants SET (autovacuum_enabled = off);
ALTER TABLE billing_counters SET (autovacuum_enabled = off);
ALTER TABLE meter_counters SET (autovacuum_enabled = off);
SET maintenance_work_mem = '256MB';
INSERT INTO meters (key, event_name, token_type, models) VALUES ('cached_in', 'cached_in_tokens', 'cache_read', '{*}') ON CONFLICT DO NOTHING;
INSERT INTO tenants (id, name, stripe_customer_id)
SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(n), 12, '0'))::uuid, 'tenant ' || lpad(n::text, 4, '0'), 'cus_' || n FROM generate_series(0, 999) n;
-- 10M logs over 90 days, created in ts order; every 3333rd pending (3,000), every 100th not_billable, the rest billed; every 20th with a meter line.
INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens, period_start,
  overage_input_tokens, overage_output_tokens, billing_status, input_accepted_at, output_accepted_at, first_attempt_at, billed_at,
  created_at, updated_at, input_report_lead, output_report_lead, meter_keys, meter_tokens, meter_overage, meter_leads, meter_accepted_at)
SELECT (lpad(to_hex(floor(extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7' || lpad(to_hex(g % 4096), 3, '0') || '8' || lpad(to_hex(g), 15, '0'))::uuid, ('00000000-0000-4000-8000-' || lpad(to_hex(g % 1000), 12, '0'))::uuid, 'r' || g, t, 'u', 'm', 100, 50, date_trunc('month', t),
  CASE WHEN st = 'not_billable' THEN 0 ELSE 10 END, CASE WHEN st = 'not_billable' THEN 0 ELSE 5 END, st,
  CASE WHEN st = 'billed' THEN t END, CASE WHEN st = 'billed' THEN t END, CASE WHEN st = 'billed' THEN t END, CASE WHEN st = 'billed' THEN t END,
  t, t,
  CASE WHEN st = 'billed' THEN ('00000000-0000-4000-9000-' || lpad(to_hex(g / 32), 12, '0'))::uuid END,
  CASE WHEN st = 'billed' THEN ('00000000-0000-4000-a000-' || lpad(to_hex(g / 32), 12, '0'))::uuid END,
  CASE WHEN m THEN '{cached_in}'::text[] END, CASE WHEN m THEN '{3}'::bigint[] END, CASE WHEN m THEN '{3}'::bigint[] END,
  CASE WHEN m AND st = 'billed' THEN ARRAY[('00000000-0000-4000-b000-' || lpad(to_hex(g / 32), 12, '0'))::uuid] WHEN m THEN '{NULL}'::uuid[] END,
  CASE WHEN m AND st = 'billed' THEN ARRAY[t] WHEN m THEN '{NULL}'::timestamptz[] END
FROM (SELECT g, now() - interval '90 days' * (1 - g / 10000000.0) AS t,
        CASE WHEN g % 3333 = 0 THEN 'pending' WHEN g % 100 = 1 THEN 'not_billable' ELSE 'billed' END AS st,
        g % 20 = 7 AS m
      FROM generate_series(1, 10000000) g) s;
-- 312,500 input reports of the billed logs (one per 32), a few hundred needs_review, 200 open past the window.
INSERT INTO usage_reports (lead_usage_log_id, dimension, tenant_id, period_start, usage_day, value, ts, member_ids, state, first_attempt_at, accepted_at, created_at)
SELECT ('00000000-0000-4000-9000-' || lpad(to_hex(n), 12, '0'))::uuid, 'input', ('00000000-0000-4000-8000-' || lpad(to_hex((n * 32) % 1000), 12, '0'))::uuid,
  date_trunc('month', t), t::date, 320, t, ARRAY[gen_random_uuid()],
  CASE WHEN n % 1000 = 5 THEN 'needs_review' WHEN n % 1500 = 7 THEN 'open' ELSE 'accepted' END, t, CASE WHEN n % 1000 <> 5 AND n % 1500 <> 7 THEN t END, t
FROM (SELECT n, now() - interval '90 days' * (1 - n * 32 / 10000000.0) AS t FROM generate_series(0, 312499) n) s;
SELECT count(*) FROM billing_counters;
SELECT count(*) FROM meter_counters;
