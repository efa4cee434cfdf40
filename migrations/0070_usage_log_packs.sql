-- The usage log partitions whose indexes retention has packed: once a
-- month's partition receives no new log (its range of ids, a range of
-- ingest time, is over) and none of its logs is pending, its indexes are
-- rebuilt at fillfactor 100 (REINDEX CONCURRENTLY, usagelog.Pack). While
-- the month was written, concurrent batches' ascending runs of ids and
-- the request_id digests' random order left their leaves about two-thirds
-- full, and billing's updates (almost never HOT) added an entry to every
-- index for each new version of a log. A row here says it was done, so a partition is packed once;
-- its sizes say what it saved. A new, empty table: nothing to lock.
CREATE TABLE usage_log_packs (
    partition          text PRIMARY KEY,
    reports_partition  text,
    packed_at          timestamptz NOT NULL DEFAULT now(),
    index_bytes_before bigint NOT NULL,
    index_bytes_after  bigint NOT NULL
);
COMMENT ON TABLE usage_log_packs IS 'usage_logs partitions whose indexes were rebuilt at fillfactor 100 after their month (usagelog.Pack); a row left by a dropped partition is harmless';
