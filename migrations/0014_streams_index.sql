-- overage:no-transaction
-- GET /v1/usage-events?request_id= lists a stream's logs. A partial index,
-- as small as the number of stream logs, built CONCURRENTLY so that on a
-- table of millions of rows ingest keeps writing (see 0003 for why the file
-- is one statement without a transaction).
CREATE INDEX CONCURRENTLY IF NOT EXISTS usage_logs_stream ON usage_logs (tenant_id, stream_request_id) WHERE stream_request_id IS NOT NULL;
