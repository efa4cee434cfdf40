-- Overage per tenant, allowance period, meter and billing status, kept
-- exact by statement triggers on usage_logs as billing_counters is (0007,
-- 0020), so GET /v1/usage answers overage, billed and pending of every
-- meter for any period from a few rows instead of a scan of the period's
-- logs, and the finance view reads the other meters' overage from it.
--
-- A log's lines: the default meters' overage in overage_input_tokens and
-- overage_output_tokens (meters "input" and "output"), every other
-- meter's in meter_keys/meter_overage. Each trigger sums its statement's
-- transition tables per (tenant, period, meter, status) and upserts each
-- counter row once, in key order, in the slot its transaction named
-- (overage.slot, else 0), so concurrent ingest transactions of one tenant
-- do not queue on one row. Rows are summed over slots on read.
--
-- Deployment on a large table: this migration only creates an empty table
-- and triggers; CREATE TRIGGER takes usage_logs in SHARE ROW EXCLUSIVE
-- mode for a few milliseconds of catalogue work (writes wait, reads go
-- on). From its commit on, every write is counted. The rows written before
-- are counted by the next migration (0042), without a lock.
SET LOCAL lock_timeout = '5s';
LOCK TABLE usage_logs IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE period_counters (
    tenant_id      uuid NOT NULL,
    period_start   timestamptz NOT NULL,
    meter          text NOT NULL,
    billing_status text NOT NULL,
    slot           smallint NOT NULL,         -- -1: the backfill of 0042
    overage_tokens bigint NOT NULL,
    PRIMARY KEY (tenant_id, period_start, meter, billing_status, slot)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
        autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 10000);

COMMENT ON TABLE period_counters IS
    'overage per tenant, allowance period, meter and billing_status, maintained by statement triggers on usage_logs';

CREATE FUNCTION period_counters_insert_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO period_counters AS c (tenant_id, period_start, meter, billing_status, slot, overage_tokens)
    SELECT n.tenant_id, n.period_start, m.meter, n.billing_status, s, sum(m.o)::bigint
    FROM new_usage_logs n CROSS JOIN LATERAL (
        SELECT 'input'::text AS meter, n.overage_input_tokens AS o
        UNION ALL SELECT 'output', n.overage_output_tokens
        UNION ALL SELECT x.k, x.o FROM unnest(n.meter_keys, n.meter_overage) AS x (k, o)
    ) AS m
    GROUP BY n.tenant_id, n.period_start, m.meter, n.billing_status
    HAVING sum(m.o) <> 0
    ORDER BY n.tenant_id, n.period_start, m.meter COLLATE "C", n.billing_status COLLATE "C"
    ON CONFLICT (tenant_id, period_start, meter, billing_status, slot) DO UPDATE SET
        overage_tokens = c.overage_tokens + EXCLUDED.overage_tokens;
    RETURN NULL;
END
$$;

CREATE FUNCTION period_counters_update_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO period_counters AS c (tenant_id, period_start, meter, billing_status, slot, overage_tokens)
    SELECT d.tenant_id, d.period_start, d.meter, d.billing_status, s, sum(d.o)::bigint
    FROM (
        SELECT o.tenant_id, o.period_start, m.meter, o.billing_status, -m.o AS o
        FROM old_usage_logs o CROSS JOIN LATERAL (
            SELECT 'input'::text AS meter, o.overage_input_tokens AS o
            UNION ALL SELECT 'output', o.overage_output_tokens
            UNION ALL SELECT x.k, x.o FROM unnest(o.meter_keys, o.meter_overage) AS x (k, o)
        ) AS m
        UNION ALL
        SELECT n.tenant_id, n.period_start, m.meter, n.billing_status, m.o
        FROM new_usage_logs n CROSS JOIN LATERAL (
            SELECT 'input'::text AS meter, n.overage_input_tokens AS o
            UNION ALL SELECT 'output', n.overage_output_tokens
            UNION ALL SELECT x.k, x.o FROM unnest(n.meter_keys, n.meter_overage) AS x (k, o)
        ) AS m
    ) AS d
    GROUP BY d.tenant_id, d.period_start, d.meter, d.billing_status
    HAVING sum(d.o) <> 0
    ORDER BY d.tenant_id, d.period_start, d.meter COLLATE "C", d.billing_status COLLATE "C"
    ON CONFLICT (tenant_id, period_start, meter, billing_status, slot) DO UPDATE SET
        overage_tokens = c.overage_tokens + EXCLUDED.overage_tokens;
    RETURN NULL;
END
$$;

CREATE FUNCTION period_counters_delete_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO period_counters AS c (tenant_id, period_start, meter, billing_status, slot, overage_tokens)
    SELECT o.tenant_id, o.period_start, m.meter, o.billing_status, s, -sum(m.o)::bigint
    FROM old_usage_logs o CROSS JOIN LATERAL (
        SELECT 'input'::text AS meter, o.overage_input_tokens AS o
        UNION ALL SELECT 'output', o.overage_output_tokens
        UNION ALL SELECT x.k, x.o FROM unnest(o.meter_keys, o.meter_overage) AS x (k, o)
    ) AS m
    GROUP BY o.tenant_id, o.period_start, m.meter, o.billing_status
    HAVING sum(m.o) <> 0
    ORDER BY o.tenant_id, o.period_start, m.meter COLLATE "C", o.billing_status COLLATE "C"
    ON CONFLICT (tenant_id, period_start, meter, billing_status, slot) DO UPDATE SET
        overage_tokens = c.overage_tokens + EXCLUDED.overage_tokens;
    RETURN NULL;
END
$$;

CREATE FUNCTION period_counters_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM period_counters;
    RETURN NULL;
END
$$;

CREATE TRIGGER usage_logs_period_counters_insert
    AFTER INSERT ON usage_logs
    REFERENCING NEW TABLE AS new_usage_logs
    FOR EACH STATEMENT EXECUTE FUNCTION period_counters_insert_rows();

CREATE TRIGGER usage_logs_period_counters_update
    AFTER UPDATE ON usage_logs
    REFERENCING OLD TABLE AS old_usage_logs NEW TABLE AS new_usage_logs
    FOR EACH STATEMENT EXECUTE FUNCTION period_counters_update_rows();

CREATE TRIGGER usage_logs_period_counters_delete
    AFTER DELETE ON usage_logs
    REFERENCING OLD TABLE AS old_usage_logs
    FOR EACH STATEMENT EXECUTE FUNCTION period_counters_delete_rows();

CREATE TRIGGER usage_logs_period_counters_truncate
    AFTER TRUNCATE ON usage_logs
    FOR EACH STATEMENT EXECUTE FUNCTION period_counters_truncate();
