-- Step 2 of 0054-0059: the bound of 0054 on usage_reports (a report's
-- lead is one of its logs' ids), NOT VALID as there (0057 validates it).
-- A transaction of its own: adding a check takes the table's exclusive
-- lock, and a report worker's transaction takes usage_reports and
-- usage_logs in either order, so one migration taking both could
-- deadlock with it.
SET LOCAL lock_timeout = '10s';

DO $$
BEGIN
    EXECUTE format('ALTER TABLE usage_reports ADD CONSTRAINT usage_reports_before_bound CHECK (lead_usage_log_id < %L::uuid) NOT VALID',
        (SELECT id FROM overage_usage_logs_bound));
END
$$;
