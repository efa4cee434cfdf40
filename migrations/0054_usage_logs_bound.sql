-- Usage logs and their reports move to tables partitioned by month of
-- ingest (0054-0059, on a live system, as 0025-0027 moved idempotency
-- records), so that a month of logs can later go by dropping its partition.
--
-- A usage log's id is a UUIDv7 minted when ingest records it, so a range
-- of ids is a range of ingest time: usage_logs is partitioned by RANGE
-- (id), usage_reports by RANGE (lead_usage_log_id) with the same bounds (a
-- report's lead is one of its logs, so a report goes with its lead's
-- month). The bound of a month is the smallest UUIDv7 of its first instant
-- (48-bit millisecond timestamp, every other bit zero).
--
-- Each step is a transaction of its own that takes at most one of the two
-- tables' exclusive locks, for catalogue changes only: a report worker
-- takes both tables in either order, and a step holding one while waiting
-- for the other could deadlock with it (measured: bench/partition_move.sh).
--
-- Step 1: bound today's usage_logs (0055: usage_reports). `bound` is the
-- start of the month after next (UTC): every id a running ingest (old or
-- new code) mints until well after this upgrade is below it. The
-- constraint is NOT VALID: it holds for new rows at once, without reading
-- the existing ones under this lock (0056 and 0057 validate them without
-- blocking writes). The tables then become the first partitions, for
-- every id below `bound` (0058, 0059).
SET LOCAL lock_timeout = '10s';

CREATE TABLE overage_usage_logs_bound (bound timestamptz NOT NULL, id uuid NOT NULL);
INSERT INTO overage_usage_logs_bound (bound, id)
SELECT b, (lpad(to_hex(floor(extract(epoch FROM b) * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid
FROM (SELECT date_trunc('month', now(), 'UTC') + interval '2 months' AS b) AS m;

DO $$
DECLARE
    b uuid := (SELECT id FROM overage_usage_logs_bound);
BEGIN
    EXECUTE format('ALTER TABLE usage_logs ADD CONSTRAINT usage_logs_before_bound CHECK (id < %L::uuid) NOT VALID', b);
END
$$;

-- The lower bound of every partition of usage_logs and usage_reports
-- (-infinity: the first, today's tables once 0058 and 0059 have made them
-- partitions), kept by the usagelog package in the transaction that
-- attaches a partition. Ingest reads it in every transaction that records
-- logs, where reading the catalogue would cost too much: whether a bound
-- is near (the claims below) and from which partition on its lookups of
-- earlier logs by request_id probe. It and the claims are made in this
-- first step so that ingest's statements work at every step of the move.
CREATE TABLE usage_log_partition_bounds (lower timestamptz PRIMARY KEY);
INSERT INTO usage_log_partition_bounds VALUES ('-infinity');

-- Across a partition bound, two transactions recording one request_id
-- write into two partitions whose unique indexes never meet. Within an
-- hour (by the database's clock) of a bound, ingest also inserts every
-- request_id it records here, so the second of two such transactions waits
-- for the first at this primary key and, once the first has committed,
-- fails with a unique violation: its pass runs again and finds the first
-- one's log. The table is emptied whole by TRUNCATE once no bound is within two
-- hours (usagelog.TruncateClaims, run by `overage work`), never row by
-- row.
CREATE TABLE usage_log_request_claims (
    tenant_id  uuid NOT NULL,
    request_id text NOT NULL,
    PRIMARY KEY (tenant_id, request_id)
);
