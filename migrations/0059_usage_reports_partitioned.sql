-- Step 6 of 0054-0059: usage_reports becomes partitioned by RANGE
-- (lead_usage_log_id), with the same bounds as usage_logs, as 0058 did
-- usage_logs: today's table becomes its partition for every lead below the
-- bound, in one short transaction of catalogue changes. Its primary key
-- (lead_usage_log_id, dimension) holds the partition key, so it stays the
-- referee; the other indexes become partitioned ones. The monthly
-- partitions are made by the usagelog package with usage_logs' (one range,
-- one name suffix).
SET LOCAL lock_timeout = '10s';
LOCK TABLE usage_reports IN ACCESS EXCLUSIVE MODE;

DO $$
DECLARE
    b uuid := (SELECT id FROM overage_usage_logs_bound);
    checks text[];
    fkeys text[];
    indexes text[];
    r record;
    q text;
BEGIN
    SELECT coalesce(array_agg(format('ALTER TABLE usage_reports ADD CONSTRAINT %I %s', conname, pg_get_constraintdef(oid)) ORDER BY conname), '{}')
    INTO checks
    FROM pg_constraint
    WHERE conrelid = 'usage_reports'::regclass AND contype IN ('c', 'f') AND conname <> 'usage_reports_before_bound';

    SELECT coalesce(array_agg(pg_get_indexdef(indexrelid) ORDER BY indexrelid::regclass::text), '{}')
    INTO indexes
    FROM pg_index
    WHERE indrelid = 'usage_reports'::regclass AND NOT indisprimary;

    IF EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'usage_reports'::regclass AND NOT tgisinternal) THEN
        RAISE EXCEPTION 'usage_reports has triggers this migration does not know how to move';
    END IF;

    ALTER TABLE usage_reports RENAME TO usage_reports_legacy;
    FOR r IN SELECT indexrelid::regclass::text AS name, indisprimary FROM pg_index
        WHERE indrelid = 'usage_reports_legacy'::regclass
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', r.name, CASE
            WHEN r.indisprimary THEN 'usage_reports_legacy_pkey'
            ELSE 'usage_reports_legacy' || substr(r.name, length('usage_reports') + 1) END);
    END LOOP;

    CREATE TABLE usage_reports (
        LIKE usage_reports_legacy INCLUDING DEFAULTS INCLUDING STORAGE INCLUDING COMPRESSION,
        CONSTRAINT usage_reports_pkey PRIMARY KEY (lead_usage_log_id, dimension)
    ) PARTITION BY RANGE (lead_usage_log_id);
    COMMENT ON TABLE usage_reports IS
        'reports of usage logs to Stripe, partitioned by RANGE (lead_usage_log_id) with the bounds of usage_logs';
    FOREACH q IN ARRAY indexes LOOP
        EXECUTE q;
    END LOOP;

    EXECUTE format('ALTER TABLE usage_reports ATTACH PARTITION usage_reports_legacy FOR VALUES FROM (MINVALUE) TO (%L)', b);

    -- The checks and the foreign key once the old table is a partition,
    -- as 0058: each merges with the partition's own, nothing is read.
    FOREACH q IN ARRAY checks LOOP
        EXECUTE q;
    END LOOP;
END
$$;

DROP TABLE overage_usage_logs_bound;
