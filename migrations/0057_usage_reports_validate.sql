-- Step 4 of 0054-0059: check the existing reports against the bound, as
-- 0056 does the logs (a report's lead is one of its logs' ids).
DO $$
BEGIN
    ALTER TABLE usage_reports VALIDATE CONSTRAINT usage_reports_before_bound;
EXCEPTION WHEN check_violation THEN
    RAISE EXCEPTION 'usage_reports holds leads that are not UUIDv7 ids minted before %: overage cannot partition it by time',
        (SELECT bound FROM overage_usage_logs_bound)
        USING HINT = 'list them with SELECT lead_usage_log_id FROM usage_reports WHERE lead_usage_log_id >= ''' ||
            (SELECT id FROM overage_usage_logs_bound) || '''';
END
$$;
