-- Idempotency records move to a table partitioned by expiry day, so that a
-- day of expired records goes by dropping its partition instead of by
-- deleting millions of rows (0025-0027, on a live system).
--
-- Step 1: bound today's table. Every record expires 24 hours after it is
-- written, so every record a running ingest (old or new code) writes during
-- the next two days expires before `bound`, three UTC midnights away. The
-- constraint is NOT VALID: it holds for new rows at once, without reading
-- the existing ones under this lock (0026 validates them without blocking
-- writes). The table then becomes the first partition, for everything
-- before `bound` (0027); it is dropped whole once `bound` has passed.
SET LOCAL lock_timeout = '10s';

CREATE TABLE overage_idempotency_keys_bound (bound timestamptz NOT NULL);
INSERT INTO overage_idempotency_keys_bound SELECT date_trunc('day', now(), 'UTC') + interval '3 days';

DO $$
BEGIN
    EXECUTE format('ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_before_bound CHECK (expires_at < %L) NOT VALID',
        (SELECT bound FROM overage_idempotency_keys_bound));
END
$$;
