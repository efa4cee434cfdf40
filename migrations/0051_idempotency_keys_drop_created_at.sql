-- A record's created_at is always its expires_at less the 24-hour TTL
-- (both from the same now() of the ingest transaction), and nothing reads
-- it: 8 bytes of every record's heap tuple, for nothing. DROP COLUMN on
-- the partitioned table and its partitions changes the catalogue only (no
-- partition is read or rewritten); existing records keep the bytes until
-- their partition is dropped, new ones store a null in the bitmap that
-- fits in the tuple header's padding. Day partitions made from now on
-- (CREATE TABLE ... LIKE idempotency_keys) have no such column at all.
-- Running code never names the column: the insert left it to its default.
SET LOCAL lock_timeout = '5s';
ALTER TABLE idempotency_keys DROP COLUMN IF EXISTS created_at;
