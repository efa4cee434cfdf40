-- billing_counters maintained once per statement, not once per row.
--
-- Why. The update and delete triggers of 0002/0007 ran once per usage log,
-- each an upsert of the same counter row. Within one transaction every such
-- upsert adds another version of that row, which the next one must step
-- over, so the cost grows with the square of the rows a transaction
-- changes: billing the 10,000 members of one report took 3.0 s (1,000 took
-- 0.06 s), and that capped one busy customer's drain at 1,707 logs/s. The
-- insert trigger has been per statement since 0007; this migration does the
-- same for UPDATE and DELETE. Each trigger now reads the statement's
-- transition tables, sums them per (tenant, billing status) and upserts
-- each counter row once per statement.
--
-- Exactness is unchanged: the triggers fire on every statement that writes
-- usage_logs (INSERT and COPY, UPDATE, DELETE; TRUNCATE keeps its own
-- trigger), in the writer's transaction. PostgreSQL allows no column list
-- (UPDATE OF ...) and no WHEN on a trigger with transition tables, so the
-- update trigger fires on every UPDATE and lets arithmetic do the
-- filtering: every old row counts -1 and minus its tokens, every new row +1
-- and plus its tokens, summed per (tenant, status); a row whose tenant,
-- status and overage did not change cancels out, and groups that sum to
-- zero are skipped, so a statement that only stamps first_attempt_at or
-- *_accepted_at touches no counter row. Not joining old to new on id keeps
-- this right even for an UPDATE that changes id.
--
-- The slot. As before, a trigger writes the slot its transaction named in
-- the setting overage.slot (ingest leases one per transaction; see 0007),
-- or slot 0 when none is named; it reads the setting once per statement.
--
-- Deadlock freedom. 0007's argument holds and gets stronger: every
-- statement upserts counter rows of ONE slot in (tenant_id, billing_status)
-- order — INSERT ... SELECT ... ORDER BY writes its rows in that order —
-- now including a multi-row UPDATE or DELETE over several tenants, whose
-- counter rows were taken in the order its rows were scanned. So two bulk
-- updates over several tenants no longer take counter rows in opposite
-- orders (their usage_logs rows are another matter, as for any UPDATE).
--
-- Deployment on a large table: only triggers and functions change; no
-- table is rewritten, scanned or backfilled. CREATE OR REPLACE TRIGGER
-- takes usage_logs in SHARE ROW EXCLUSIVE mode (taken first, below), which
-- blocks writes to usage_logs — not reads — until this transaction
-- commits, a few milliseconds of catalogue work. All three triggers are
-- replaced in this one transaction while writes wait, so every write is
-- counted by exactly one generation of triggers: none twice, none never.
-- lock_timeout bounds the wait behind a long-running writer (writers
-- queue behind a waiting lock request); on timeout nothing was applied and
-- the migration can be run again.

SET LOCAL lock_timeout = '5s';
LOCK TABLE usage_logs IN SHARE ROW EXCLUSIVE MODE;

CREATE FUNCTION billing_counters_update_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO billing_counters AS c (tenant_id, billing_status, slot, usage_logs, overage_input_tokens, overage_output_tokens)
    SELECT d.tenant_id, d.billing_status, s, sum(d.n)::bigint, sum(d.i)::bigint, sum(d.o)::bigint
    FROM (
        SELECT o.tenant_id, o.billing_status, -1 AS n, -o.overage_input_tokens AS i, -o.overage_output_tokens AS o
        FROM old_usage_logs o
        UNION ALL
        SELECT n.tenant_id, n.billing_status, 1, n.overage_input_tokens, n.overage_output_tokens
        FROM new_usage_logs n
    ) AS d
    GROUP BY d.tenant_id, d.billing_status
    HAVING sum(d.n) <> 0 OR sum(d.i) <> 0 OR sum(d.o) <> 0
    ORDER BY d.tenant_id, d.billing_status COLLATE "C"
    ON CONFLICT (tenant_id, billing_status, slot) DO UPDATE SET
        usage_logs            = c.usage_logs + EXCLUDED.usage_logs,
        overage_input_tokens  = c.overage_input_tokens + EXCLUDED.overage_input_tokens,
        overage_output_tokens = c.overage_output_tokens + EXCLUDED.overage_output_tokens;
    RETURN NULL;
END
$$;

CREATE FUNCTION billing_counters_delete_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO billing_counters AS c (tenant_id, billing_status, slot, usage_logs, overage_input_tokens, overage_output_tokens)
    SELECT o.tenant_id, o.billing_status, s,
           -count(*), -sum(o.overage_input_tokens)::bigint, -sum(o.overage_output_tokens)::bigint
    FROM old_usage_logs o
    GROUP BY o.tenant_id, o.billing_status
    ORDER BY o.tenant_id, o.billing_status COLLATE "C"
    ON CONFLICT (tenant_id, billing_status, slot) DO UPDATE SET
        usage_logs            = c.usage_logs + EXCLUDED.usage_logs,
        overage_input_tokens  = c.overage_input_tokens + EXCLUDED.overage_input_tokens,
        overage_output_tokens = c.overage_output_tokens + EXCLUDED.overage_output_tokens;
    RETURN NULL;
END
$$;

-- Same names as before, so operators who disable a trigger by name keep
-- working. CREATE OR REPLACE swaps each in place under the lock above
-- (DROP TRIGGER would take ACCESS EXCLUSIVE and block readers too).
CREATE OR REPLACE TRIGGER usage_logs_billing_counters_update
    AFTER UPDATE ON usage_logs
    REFERENCING OLD TABLE AS old_usage_logs NEW TABLE AS new_usage_logs
    FOR EACH STATEMENT EXECUTE FUNCTION billing_counters_update_rows();

CREATE OR REPLACE TRIGGER usage_logs_billing_counters_delete
    AFTER DELETE ON usage_logs
    REFERENCING OLD TABLE AS old_usage_logs
    FOR EACH STATEMENT EXECUTE FUNCTION billing_counters_delete_rows();

-- The per-row function no trigger uses any more.
DROP FUNCTION billing_counters_track();
