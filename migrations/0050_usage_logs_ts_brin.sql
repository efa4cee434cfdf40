-- overage:no-transaction
-- Reconciliation sums billed overage per customer and day over a range of
-- ts, and nothing indexed ts: every run read every usage log ever written,
-- whatever the range (docs/plans.md). A BRIN index keeps, per 32 pages of
-- the table, the ts values found there (minmax-multi: several intervals,
-- so the few late or corrected logs written long after their ts widen no
-- range), which is what a table written in ts order needs to read only
-- the pages of the days asked: a few pages in all, not a B-tree entry per
-- log. autosummarize queues the summary of each range as it fills; pages
-- written since the last summary are read by every range query until
-- autovacuum summarizes them. CONCURRENTLY, one statement, no transaction:
-- see 0003.
CREATE INDEX CONCURRENTLY IF NOT EXISTS usage_logs_ts ON usage_logs
    USING brin (ts timestamptz_minmax_multi_ops) WITH (pages_per_range = 32, autosummarize = on);
