-- overage:no-transaction
-- Drops the (tenant_id, billing_status) index now that 0022's partial index
-- serves the only reads that used it. CONCURRENTLY: no ingest or worker
-- write waits for it.
DROP INDEX CONCURRENTLY IF EXISTS usage_logs_tenant_status;
