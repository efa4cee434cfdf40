-- finance: the oldest pending usage log of each tenant (oldest_pending_at in
-- `overage status`) is the first entry of this index, which stays as small
-- as the backlog.
--
-- Not CONCURRENTLY, on purpose. migrations.Migrate serialises migrators
-- with pg_advisory_lock, and a migrator waiting in that call holds a
-- snapshot; CREATE INDEX CONCURRENTLY waits for every older snapshot in the
-- database, so with two `overage migrate` running at once the build
-- deadlocks with the waiter (seen in TestMigrateConcurrentlyThenAgain). The
-- aborted build would leave an INVALID index that the next run's
-- IF NOT EXISTS keeps, silently. Until the runner waits without a snapshot
-- (polling pg_try_advisory_lock from Go), an index belongs in a
-- transaction.
--
-- Deployment on a large table: CREATE INDEX takes a SHARE lock, which
-- blocks ingest and worker writes (not reads) while it scans usage_logs —
-- 3.9 s for 10 million logs on the 2-core benchmark machine. lock_timeout
-- makes the migration give up rather than queue every writer behind a
-- long-running transaction; it then applied nothing and can be run again.

SET LOCAL lock_timeout = '30s';

CREATE INDEX IF NOT EXISTS usage_logs_tenant_pending
    ON usage_logs (tenant_id, created_at) WHERE billing_status = 'pending';
