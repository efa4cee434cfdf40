-- Proves 0010's relaxed CHECK for the rows written before it. VALIDATE
-- CONSTRAINT scans usage_logs under a SHARE UPDATE EXCLUSIVE lock, which
-- lets ingest, the workers and readers go on: that is why it is a step of
-- its own, after the catalogue-only change of 0010 has committed. Every
-- existing row met the stricter rules of 0001, so it cannot fail.
ALTER TABLE usage_logs VALIDATE CONSTRAINT usage_logs_tokens_check;
