-- Step 3: the partitioned table takes the name, today's table becomes its
-- partition for everything expiring before the bound, in one short
-- transaction (renames and catalogue changes only: nothing is read or
-- copied). A statement prepared by a running ingest resolves the name again
-- and goes on against the new table.
--
-- The partitioned table has no index of its own: a unique index there would
-- have to include expires_at and would referee nothing. Each partition has
-- its own unique index on (tenant_id, idempotency_key), made by
-- the idempotency package when it creates the partition, so within a
-- partition the constraint is the referee; across partitions a key's records
-- are told apart by expires_at, and the ingest transaction's key lock orders
-- its writers. A new record expires 24 hours after any expired one of its
-- key, so it never lands in an expired record's day; the one partition that
-- spans days (this one) keeps its primary key, and ingest deletes an expired
-- record before storing its key anew.
--
-- The partitions from the bound on are created by `overage migrate` right
-- after this file and by `overage work` every hour, a week ahead.
SET LOCAL lock_timeout = '10s';
LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE;

ALTER TABLE idempotency_keys RENAME TO idempotency_keys_legacy;
ALTER INDEX idempotency_keys_pkey RENAME TO idempotency_keys_legacy_pkey;
-- Read only by the row-by-row reaper that partitions replace.
DROP INDEX idempotency_keys_expires_at;

CREATE TABLE idempotency_keys (
    tenant_id       uuid NOT NULL,
    idempotency_key text NOT NULL,
    fingerprint     bytea NOT NULL,
    response_status integer NOT NULL,
    response_body   bytea NOT NULL,
    usage_log_id    uuid,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL
) PARTITION BY RANGE (expires_at);

COMMENT ON TABLE idempotency_keys IS
    'stored answers per (tenant, Idempotency-Key), partitioned by expiry day; expired partitions are dropped whole by overage work';

DO $$
BEGIN
    ALTER TABLE idempotency_keys ALTER COLUMN response_body SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'lz4 is not available: idempotency_keys.response_body keeps the default compression';
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER TABLE idempotency_keys ATTACH PARTITION idempotency_keys_legacy FOR VALUES FROM (MINVALUE) TO (%L)',
        (SELECT bound FROM overage_idempotency_keys_bound));
END
$$;

DROP TABLE overage_idempotency_keys_bound;
