-- Step 5 of 0054-0059: the partitioned usage_logs takes the name, today's
-- table becomes its partition for every id below the bound, in one short
-- transaction (renames and catalogue changes only: nothing is read or
-- copied; the check validated by 0056 spares ATTACH its scan). A statement
-- prepared by a running ingest or worker resolves the name again and goes
-- on against the new table.
--
-- The partitioned table carries the same columns, defaults and checks, the
-- primary key (id: it is the partition key) and every index that is not
-- unique, as partitioned indexes (the old table's become its partition's,
-- nothing is built). The unique rule on (tenant_id, request_id) cannot be
-- the parent's (it would have to include id): each partition has its own
-- unique index, `<partition>_request_id`, made with the partition by the
-- usagelog package, which is the referee within a partition; across the
-- bound of two partitions, ingest claims request_ids in
-- usage_log_request_claims (below) near each bound.
--
-- The statement-level triggers that keep billing_counters and
-- period_counters (transition tables) move to the partitioned table: a
-- partition may not keep them, and there they fire once per statement
-- whichever partitions it writes.
--
-- The monthly partitions from the bound on are created by `overage
-- migrate` right after the migrations and by `overage work` every hour,
-- ahead of time.
SET LOCAL lock_timeout = '10s';
LOCK TABLE usage_logs IN ACCESS EXCLUSIVE MODE;

-- A foreign key to usage_logs would stop any partition from ever being
-- dropped. A review action keeps the id of the log it resolved as history
-- (the log was there when the action was written, under its row lock), not
-- as a reference that must outlive the log.
ALTER TABLE review_actions DROP CONSTRAINT review_actions_usage_log_id_fkey;

DO $$
DECLARE
    b uuid := (SELECT id FROM overage_usage_logs_bound);
    checks text[];
    indexes text[];
    triggers text[];
    r record;
    q text;
BEGIN
    -- The old table's definitions, read while they still name usage_logs:
    -- run again below, they define the same on the partitioned table.
    -- usage_logs_tokens_check is written as 0031 wrote it: its BETWEENs,
    -- read back as pairs of comparisons, would parse to another tree than
    -- the partition's, and the two would not merge.
    SELECT coalesce(array_agg(format('ALTER TABLE usage_logs ADD CONSTRAINT %I %s', conname, CASE conname
            WHEN 'usage_logs_tokens_check' THEN $c$CHECK (
                (corrects IS NOT NULL OR (input_tokens >= 0 AND output_tokens >= 0))
                AND (meter_keys IS NOT NULL OR (
                    overage_input_tokens BETWEEN least(0, input_tokens) AND greatest(0, input_tokens)
                    AND overage_output_tokens BETWEEN least(0, output_tokens) AND greatest(0, output_tokens)))
                AND (corrects IS NULL) = (correction_reason IS NULL)
                AND cardinality(meter_keys) = cardinality(meter_tokens)
                AND cardinality(meter_keys) = cardinality(meter_overage))$c$ || CASE WHEN convalidated THEN '' ELSE ' NOT VALID' END
            ELSE pg_get_constraintdef(oid) END) ORDER BY conname), '{}')
    INTO checks
    FROM pg_constraint
    WHERE conrelid = 'usage_logs'::regclass AND contype = 'c' AND conname <> 'usage_logs_before_bound';

    SELECT coalesce(array_agg(pg_get_indexdef(indexrelid) ORDER BY indexrelid::regclass::text), '{}')
    INTO indexes
    FROM pg_index
    WHERE indrelid = 'usage_logs'::regclass AND NOT indisunique;

    SELECT coalesce(array_agg(pg_get_triggerdef(oid) ORDER BY tgname), '{}')
    INTO triggers
    FROM pg_trigger
    WHERE tgrelid = 'usage_logs'::regclass AND NOT tgisinternal;

    ALTER TABLE usage_logs RENAME TO usage_logs_legacy;
    FOR r IN SELECT indexrelid::regclass::text AS name, indisunique, indisprimary FROM pg_index
        WHERE indrelid = 'usage_logs_legacy'::regclass
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', r.name, CASE
            WHEN r.indisprimary THEN 'usage_logs_legacy_pkey'
            WHEN r.indisunique THEN 'usage_logs_legacy_request_id'
            ELSE 'usage_logs_legacy' || substr(r.name, length('usage_logs') + 1) END);
    END LOOP;
    FOR r IN SELECT tgname FROM pg_trigger WHERE tgrelid = 'usage_logs_legacy'::regclass AND NOT tgisinternal
    LOOP
        EXECUTE format('DROP TRIGGER %I ON usage_logs_legacy', r.tgname);
    END LOOP;

    CREATE TABLE usage_logs (
        LIKE usage_logs_legacy INCLUDING DEFAULTS INCLUDING STORAGE INCLUDING COMPRESSION,
        CONSTRAINT usage_logs_pkey PRIMARY KEY (id)
    ) PARTITION BY RANGE (id);
    COMMENT ON TABLE usage_logs IS
        'usage logs, partitioned by RANGE (id): UUIDv7 ids minted at ingest, one partition a UTC month of ingest (usagelog.Partitions)';
    FOREACH q IN ARRAY indexes LOOP
        EXECUTE q;
    END LOOP;

    EXECUTE format('ALTER TABLE usage_logs ATTACH PARTITION usage_logs_legacy FOR VALUES FROM (MINVALUE) TO (%L)', b);

    -- The checks once the old table is a partition: each merges with the
    -- partition's own of that name (valid stays valid, nothing is read).
    -- Made before ATTACH they would have to match the partition's text,
    -- which differs where the old table has dropped columns.
    FOREACH q IN ARRAY checks LOOP
        EXECUTE q;
    END LOOP;

    FOREACH q IN ARRAY triggers LOOP
        EXECUTE q;
    END LOOP;
END
$$;
