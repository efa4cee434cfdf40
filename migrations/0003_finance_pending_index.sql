-- overage:no-transaction
-- finance: the oldest pending usage log of each tenant (oldest_pending_at in
-- `overage status`) is the first entry of this index, which stays as small
-- as the backlog.
--
-- CONCURRENTLY, so building it on a table of millions of rows blocks no
-- ingest or worker write. That cannot run inside a transaction, hence the
-- first line, and the file holds exactly one statement (pgx sends a
-- multi-statement string as one implicit transaction). Migrate waits for
-- other migrators by polling, holding no snapshot this build would wait
-- for, and refuses to record the file if the build left an INVALID index;
-- IF NOT EXISTS alone would keep such an index silently.
CREATE INDEX CONCURRENTLY IF NOT EXISTS usage_logs_tenant_pending
    ON usage_logs (tenant_id, created_at) WHERE billing_status = 'pending';
