-- Proves 0031's CHECK for the rows written before it. VALIDATE scans the
-- table under SHARE UPDATE EXCLUSIVE, which blocks neither reads nor
-- writes (only other schema changes), so it runs beside serve and work on
-- a table of any size.
ALTER TABLE usage_logs VALIDATE CONSTRAINT usage_logs_tokens_check;
