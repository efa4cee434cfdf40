-- Step 3 of 0054-0059: check the existing usage logs against the bound.
-- VALIDATE reads the table under SHARE UPDATE EXCLUSIVE, which lets ingest
-- and the workers read and write meanwhile; the check is what lets 0058
-- attach the table as a partition without reading it again under an
-- exclusive lock.
--
-- Every id ingest ever minted is a UUIDv7 of its time, below the bound. An
-- id at or above it was not minted by overage (a random UUID, from a seed
-- script): it could not be placed in a monthly partition, so the upgrade
-- stops here with nothing changed but the NOT VALID checks of 0054 and
-- 0055.
DO $$
BEGIN
    ALTER TABLE usage_logs VALIDATE CONSTRAINT usage_logs_before_bound;
EXCEPTION WHEN check_violation THEN
    RAISE EXCEPTION 'usage_logs holds ids that are not UUIDv7 ids minted before %: overage cannot partition it by time',
        (SELECT bound FROM overage_usage_logs_bound)
        USING HINT = 'list them with SELECT id FROM usage_logs WHERE id >= ''' || (SELECT id FROM overage_usage_logs_bound) ||
            '''; such ids come from seed scripts or imports, not from ingest';
END
$$;
