-- overage:no-transaction
-- GET on a usage log lists its corrections, and a correction adds up the
-- earlier ones of its original: a partial index, as small as the number of
-- corrections. CONCURRENTLY, so building it on a table of millions of rows
-- blocks no ingest or worker write; that cannot run in a transaction,
-- hence the first line and exactly one statement (see 0003).
CREATE INDEX CONCURRENTLY IF NOT EXISTS usage_logs_corrects ON usage_logs (corrects) WHERE corrects IS NOT NULL;
