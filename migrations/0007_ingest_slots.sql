-- Ingest without a per-tenant bottleneck: the two rows every event of a
-- tenant used to update — its allowance_usage period row and its
-- billing_counters row — are spread over slots, summed on read.
--
-- Why. A row updated by a transaction stays locked until that transaction
-- commits (WAL flush included), so a tenant whose every event updated the
-- same two rows had its events commit one at a time: about 600 events/s
-- for one tenant however many app servers sent them. With slots,
-- concurrent transactions update different rows and their commits overlap.
--
-- The slot of a row is the writer's: `overage serve` leases each ingest
-- transaction a slot from 1 to 64 that no other transaction of the process
-- holds (ingest/slots.go) and names it in the transaction setting
-- overage.slot, which the counter triggers read. A writer that names none
-- (the report workers, an operator's UPDATE, RebuildCounters) writes slot
-- 0, as every write did before this migration.
--
-- allowance_usage. Slot 0 is also the ordered row: an event whose period
-- still has allowance left takes a transaction-scoped advisory lock on
-- (tenant, period), reads the period's total (the sum over all slots) in a
-- statement that starts after the lock is granted, and adds its tokens to
-- slot 0, so such events of one tenant and period are ordered and each
-- sees the exact total before it: the split across the allowance stays
-- exact. Once a period's committed total has reached the allowance in both
-- dimensions (always, for a tenant with no allowance) nothing needs
-- ordering — totals only grow, so every later event's overage is all of its
-- tokens — and the event takes no lock and adds to its leased slot. An
-- ordered event never misses an unordered one: an unordered transaction in
-- flight saw a committed total at or above the allowance, the ordered one
-- reads later and sees that total too, so it charges all its tokens as
-- well.
--
-- billing_counters. Each row is now (tenant, billing status, slot); every
-- reader sums over slots (finance.Status, finance.NeedsReview,
-- metrics.ReadBacklog) and finance.RebuildCounters writes slot 0. The
-- insert trigger is now per statement over a transition table: a batch of
-- 1,000 logs costs one counter upsert per (tenant, status), not 1,000
-- updates of one row.
--
-- Deadlock freedom (replacing the reasoning of 0002_finance.sql, which
-- still holds with "row" read as "row of one slot"): every statement that
-- touches counter rows touches those of ONE slot (its transaction's), in
-- (tenant_id, billing_status) order — the insert trigger groups and sorts,
-- the update trigger upserts at most the old and new status of one log
-- sorted, the delete trigger one row. An ingest transaction takes, in this
-- order: the idempotency advisory lock (try, never waits); the allowance
-- advisory locks of its periods, sorted, only while some allowance is
-- left; its allowance rows in (period, slot) order; the unique index
-- entries of its usage logs in request_id order; the counter rows of its
-- slot; River's job rows (before the rest, in its own statement, with keys
-- no other transaction writes). No path takes these in the opposite order:
-- the workers and the sweep take counter rows and River's job rows, never
-- an allowance lock or row; two ingest transactions sharing request_ids
-- insert them in the same order.
--
-- Deployment on a large database: usage_logs is not rewritten or scanned.
-- allowance_usage holds one row per tenant and period and billing_counters
-- a few per tenant: adding a column with a constant default is
-- catalogue-only, and rebuilding their primary keys takes milliseconds per
-- thousand tenants, under an ACCESS EXCLUSIVE lock that blocks ingest for
-- that long. lock_timeout makes the migration give up rather than queue
-- every writer behind a long transaction; it then applied nothing and can
-- be run again.

-- The tables are locked in the order an ingest transaction first touches
-- them (its reads: stored answers, logs, allowance; then the counters), so
-- the migration queues behind ingest instead of deadlocking with it.
SET LOCAL lock_timeout = '30s';
LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE;
LOCK TABLE usage_logs IN SHARE ROW EXCLUSIVE MODE;
LOCK TABLE allowance_usage IN ACCESS EXCLUSIVE MODE;
LOCK TABLE billing_counters IN ACCESS EXCLUSIVE MODE;

ALTER TABLE allowance_usage ADD COLUMN slot smallint NOT NULL DEFAULT 0;
ALTER TABLE allowance_usage DROP CONSTRAINT allowance_usage_pkey,
    ADD PRIMARY KEY (tenant_id, period_start, slot);

ALTER TABLE billing_counters ADD COLUMN slot smallint NOT NULL DEFAULT 0;
ALTER TABLE billing_counters DROP CONSTRAINT billing_counters_pkey,
    ADD PRIMARY KEY (tenant_id, billing_status, slot);

COMMENT ON TABLE billing_counters IS
    'usage_logs count and overage sums per tenant and billing_status, spread over slots (sum them), maintained by triggers on usage_logs; rebuild with finance.RebuildCounters';

-- The update and delete paths: one log at a time, both of its rows in the
-- writer's slot.
CREATE OR REPLACE FUNCTION billing_counters_track() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO billing_counters AS c (tenant_id, billing_status, slot, usage_logs, overage_input_tokens, overage_output_tokens)
        VALUES (OLD.tenant_id, OLD.billing_status, s, -1, -OLD.overage_input_tokens, -OLD.overage_output_tokens)
        ON CONFLICT (tenant_id, billing_status, slot) DO UPDATE SET
            usage_logs            = c.usage_logs + EXCLUDED.usage_logs,
            overage_input_tokens  = c.overage_input_tokens + EXCLUDED.overage_input_tokens,
            overage_output_tokens = c.overage_output_tokens + EXCLUDED.overage_output_tokens;
    ELSE
        -- At most two rows of one slot, in (tenant_id, billing_status)
        -- order: an INSERT ... SELECT ... ORDER BY processes its rows in
        -- that order.
        INSERT INTO billing_counters AS c (tenant_id, billing_status, slot, usage_logs, overage_input_tokens, overage_output_tokens)
        SELECT d.tenant_id, d.billing_status, s, sum(d.n)::bigint, sum(d.i)::bigint, sum(d.o)::bigint
        FROM (VALUES
            (OLD.tenant_id, OLD.billing_status, -1::bigint, -OLD.overage_input_tokens, -OLD.overage_output_tokens),
            (NEW.tenant_id, NEW.billing_status,  1::bigint,  NEW.overage_input_tokens,  NEW.overage_output_tokens)
        ) AS d (tenant_id, billing_status, n, i, o)
        GROUP BY d.tenant_id, d.billing_status
        ORDER BY d.tenant_id, d.billing_status COLLATE "C"
        ON CONFLICT (tenant_id, billing_status, slot) DO UPDATE SET
            usage_logs            = c.usage_logs + EXCLUDED.usage_logs,
            overage_input_tokens  = c.overage_input_tokens + EXCLUDED.overage_input_tokens,
            overage_output_tokens = c.overage_output_tokens + EXCLUDED.overage_output_tokens;
    END IF;
    RETURN NULL;
END
$$;

-- The insert path: once per statement, over every row it inserted.
CREATE FUNCTION billing_counters_insert_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO billing_counters AS c (tenant_id, billing_status, slot, usage_logs, overage_input_tokens, overage_output_tokens)
    SELECT n.tenant_id, n.billing_status, s,
           count(*), sum(n.overage_input_tokens)::bigint, sum(n.overage_output_tokens)::bigint
    FROM new_usage_logs n
    GROUP BY n.tenant_id, n.billing_status
    ORDER BY n.tenant_id, n.billing_status COLLATE "C"
    ON CONFLICT (tenant_id, billing_status, slot) DO UPDATE SET
        usage_logs            = c.usage_logs + EXCLUDED.usage_logs,
        overage_input_tokens  = c.overage_input_tokens + EXCLUDED.overage_input_tokens,
        overage_output_tokens = c.overage_output_tokens + EXCLUDED.overage_output_tokens;
    RETURN NULL;
END
$$;

-- Same name as before, so operators (and bench/status) that disable it by
-- name for a bulk load keep working.
DROP TRIGGER usage_logs_billing_counters_insert ON usage_logs;
CREATE TRIGGER usage_logs_billing_counters_insert
    AFTER INSERT ON usage_logs
    REFERENCING NEW TABLE AS new_usage_logs
    FOR EACH STATEMENT EXECUTE FUNCTION billing_counters_insert_rows();

-- A batch's stored answer is up to about 700 KB of JSON. lz4 compresses it
-- several times faster than the default pglz, which the ingest
-- transaction pays for on every batch (single answers are too small to be
-- compressed at all). Catalogue-only: existing rows keep their
-- compression. A server built without lz4 keeps pglz.
DO $$
BEGIN
    ALTER TABLE idempotency_keys ALTER COLUMN response_body SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'lz4 is not available: idempotency_keys.response_body keeps the default compression';
END
$$;
