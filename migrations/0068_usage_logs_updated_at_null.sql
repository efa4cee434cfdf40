-- A usage log is written with updated_at NULL from this release: it only
-- repeated created_at, and its 8 bytes took a batched log's heap tuple
-- from 176 to 184 bytes (MAXALIGN: 43 tuples a page instead of 45, about
-- 9 of a log's 288 bytes on disk; docs/benchmarks.md, "updated_at NULL on
-- a new log"). The statements that change a log still set it, so
-- updated_at NULL reads "never changed since created_at". Nothing reads
-- the column to answer a request. Catalogue only: dropping NOT NULL and a
-- default reads and writes no row, under a brief lock of the table and
-- its partitions.
SET LOCAL lock_timeout = '5s';
ALTER TABLE usage_logs ALTER COLUMN updated_at DROP NOT NULL, ALTER COLUMN updated_at DROP DEFAULT;
COMMENT ON COLUMN usage_logs.updated_at IS 'when the log last changed; NULL: never since created_at';
