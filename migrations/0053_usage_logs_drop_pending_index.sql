-- overage:no-transaction
-- usage_logs_pending (created_at, id) of pending logs was read only for the
-- oldest pending log of all tenants (the status totals and the metrics
-- backlog), which now take the first entry of usage_logs_tenant_pending of
-- each tenant with pending logs (usagelog.OldestPendingSQL). It cost every
-- log an index entry while pending, about 50 bytes, written at ingest and
-- again removed after billing. CONCURRENTLY: no ingest or worker write
-- waits for it.
DROP INDEX CONCURRENTLY IF EXISTS usage_logs_pending;
