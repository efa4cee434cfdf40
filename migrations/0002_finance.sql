-- Finance: billed-status counters per (tenant, billing status), kept exact by
-- triggers on usage_logs, so `GET /v1/billing/status` and `overage status`
-- read a handful of rows per tenant instead of aggregating every usage log
-- (a GROUP BY over 10 million logs takes seconds; the counters take
-- milliseconds; see bench/status).
--
-- Exactness. Row-level triggers fire on every path that writes usage_logs —
-- the ingest insert, the report worker and the sweep (billed, failed,
-- needs_review), an operator's UPDATE, a DELETE, COPY — so no code path has
-- to remember to update the counters. TRUNCATE empties them too. The
-- counters change in the same transaction as the log, so a rollback undoes
-- both. finance.RebuildCounters recomputes them from usage_logs (an operator
-- tool, and the benchmark's seeding path).
--
-- Locking. A counter row is hot: every log of a tenant touches it. The
-- trigger therefore never reads-then-writes; it upserts a delta
-- (INSERT ... ON CONFLICT DO UPDATE SET n = n + EXCLUDED.n), which takes the
-- row lock only for the rest of the writing transaction, and it touches at
-- most two rows per log (the old status's and the new status's) in
-- (tenant_id, billing_status) order. Per path:
--   * ingest: one row, (tenant, pending or not_billable), after the
--     allowance_usage row the transaction already serialises on; nothing
--     else takes the allowance row, so no cycle is possible.
--   * report worker / one-log status change: two rows of one tenant in
--     sorted order, then only River's job row: two such transactions can
--     wait for each other but never in a cycle.
--   * the sweep's park (many logs in one UPDATE): per log two rows of that
--     log's tenant, sorted; it holds (T, needs_review) and (T, pending) and
--     never waits for a row a single-log transaction could hold while
--     waiting for it.
-- What stays possible: two concurrent multi-row UPDATEs that change the
-- status of logs of several tenants in opposite orders can deadlock; no
-- such pair exists today (the sweep is one periodic job), PostgreSQL
-- detects it within deadlock_timeout and aborts one (SQLSTATE 40P01,
-- retryable). A future bulk operator action should update in tenant order.
-- The worker's first_attempt_at and *_accepted_at stamps do not fire the
-- trigger (UPDATE OF names only the counted columns, WHEN skips an UPDATE
-- that sets them unchanged), so they cost nothing extra.
--
-- Deployment on a large table: the backfill reads every usage log while
-- holding usage_logs in SHARE ROW EXCLUSIVE mode (taken first, before the
-- trigger exists), so no write can slip between the backfill and the
-- trigger. This BLOCKS INGEST AND WORKER WRITES for the backfill's duration
-- — one sequential scan and GROUP BY, a few seconds per few million rows
-- (4 to 9 s for 10 million on a busy 2-core machine, see bench/status) —
-- while reads go on. lock_timeout makes the migration give up rather than
-- queue every writer behind a long-running transaction; it then applied
-- nothing and can be run again.

SET LOCAL lock_timeout = '30s';
LOCK TABLE usage_logs IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE billing_counters (
    tenant_id             uuid NOT NULL,
    billing_status        text NOT NULL CHECK (billing_status IN ('pending', 'billed', 'not_billable', 'needs_review', 'failed')),
    usage_logs            bigint NOT NULL,
    overage_input_tokens  bigint NOT NULL,
    overage_output_tokens bigint NOT NULL,
    PRIMARY KEY (tenant_id, billing_status)
-- A few rows per tenant, each updated on every log: free room on each page
-- keeps the updates HOT (no index write), and vacuum runs on update count,
-- not on the table's (tiny) size.
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
        autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 10000);

COMMENT ON TABLE billing_counters IS
    'usage_logs count and overage sums per tenant and billing_status, maintained by triggers on usage_logs; rebuild with finance.RebuildCounters';

CREATE FUNCTION billing_counters_track() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO billing_counters AS c (tenant_id, billing_status, usage_logs, overage_input_tokens, overage_output_tokens)
        VALUES (NEW.tenant_id, NEW.billing_status, 1, NEW.overage_input_tokens, NEW.overage_output_tokens)
        ON CONFLICT (tenant_id, billing_status) DO UPDATE SET
            usage_logs            = c.usage_logs + EXCLUDED.usage_logs,
            overage_input_tokens  = c.overage_input_tokens + EXCLUDED.overage_input_tokens,
            overage_output_tokens = c.overage_output_tokens + EXCLUDED.overage_output_tokens;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO billing_counters AS c (tenant_id, billing_status, usage_logs, overage_input_tokens, overage_output_tokens)
        VALUES (OLD.tenant_id, OLD.billing_status, -1, -OLD.overage_input_tokens, -OLD.overage_output_tokens)
        ON CONFLICT (tenant_id, billing_status) DO UPDATE SET
            usage_logs            = c.usage_logs + EXCLUDED.usage_logs,
            overage_input_tokens  = c.overage_input_tokens + EXCLUDED.overage_input_tokens,
            overage_output_tokens = c.overage_output_tokens + EXCLUDED.overage_output_tokens;
    ELSE
        -- The old row's contribution leaves, the new row's arrives: at most
        -- two counter rows, locked in (tenant_id, billing_status) order — an
        -- INSERT ... SELECT ... ORDER BY processes its rows in that order —
        -- so no two transactions take them in opposite orders.
        INSERT INTO billing_counters AS c (tenant_id, billing_status, usage_logs, overage_input_tokens, overage_output_tokens)
        SELECT d.tenant_id, d.billing_status, sum(d.n)::bigint, sum(d.i)::bigint, sum(d.o)::bigint
        FROM (VALUES
            (OLD.tenant_id, OLD.billing_status, -1::bigint, -OLD.overage_input_tokens, -OLD.overage_output_tokens),
            (NEW.tenant_id, NEW.billing_status,  1::bigint,  NEW.overage_input_tokens,  NEW.overage_output_tokens)
        ) AS d (tenant_id, billing_status, n, i, o)
        GROUP BY d.tenant_id, d.billing_status
        ORDER BY d.tenant_id, d.billing_status COLLATE "C"
        ON CONFLICT (tenant_id, billing_status) DO UPDATE SET
            usage_logs            = c.usage_logs + EXCLUDED.usage_logs,
            overage_input_tokens  = c.overage_input_tokens + EXCLUDED.overage_input_tokens,
            overage_output_tokens = c.overage_output_tokens + EXCLUDED.overage_output_tokens;
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION billing_counters_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM billing_counters;
    RETURN NULL;
END
$$;

CREATE TRIGGER usage_logs_billing_counters_insert
    AFTER INSERT ON usage_logs
    FOR EACH ROW EXECUTE FUNCTION billing_counters_track();

CREATE TRIGGER usage_logs_billing_counters_update
    AFTER UPDATE OF billing_status, tenant_id, overage_input_tokens, overage_output_tokens ON usage_logs
    FOR EACH ROW
    WHEN (OLD.billing_status IS DISTINCT FROM NEW.billing_status
       OR OLD.tenant_id IS DISTINCT FROM NEW.tenant_id
       OR OLD.overage_input_tokens IS DISTINCT FROM NEW.overage_input_tokens
       OR OLD.overage_output_tokens IS DISTINCT FROM NEW.overage_output_tokens)
    EXECUTE FUNCTION billing_counters_track();

CREATE TRIGGER usage_logs_billing_counters_delete
    AFTER DELETE ON usage_logs
    FOR EACH ROW EXECUTE FUNCTION billing_counters_track();

CREATE TRIGGER usage_logs_billing_counters_truncate
    AFTER TRUNCATE ON usage_logs
    FOR EACH STATEMENT EXECUTE FUNCTION billing_counters_truncate();

-- Backfill, under the lock taken above: the same statement as
-- finance.RebuildCounters.
INSERT INTO billing_counters (tenant_id, billing_status, usage_logs, overage_input_tokens, overage_output_tokens)
SELECT tenant_id, billing_status, count(*), sum(overage_input_tokens), sum(overage_output_tokens)
FROM usage_logs
GROUP BY tenant_id, billing_status;
