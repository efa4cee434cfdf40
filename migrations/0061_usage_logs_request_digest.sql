-- Usage log partitions made from now on index (tenant_id,
-- md5(request_id)::uuid) instead of (tenant_id, request_id) (AddPartition,
-- usagelog.RequestDigestSQL): 16 bytes of key whatever the request_id's
-- length: 108.6 -> 61.2 bytes a batched log on 32-character request ids,
-- and fillfactor 100: 405 -> 309 bytes in all (docs/benchmarks.md). As 0052 did for idempotency_keys, this moves the
-- partitions that hold no log (the months made ahead, and a new database's
-- partitions) onto the new index under a brief lock, with nothing to read
-- or build, and sets their fillfactor (catalogue only: they hold no page).
-- A partition that holds logs keeps its index on the request_id until it
-- is dropped; the lookups state both conditions (usagelog.RequestIDIs), so
-- each partition uses the index it has.
SET LOCAL lock_timeout = '5s';
DO $$
DECLARE
    p regclass;
    old record;
    holds boolean;
    name text;
BEGIN
    FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'usage_logs'::regclass ORDER BY 1 LOOP
        -- A partition being written is passed over without a lock. An
        -- empty one is locked (SHARE: nothing is written into it until
        -- this transaction ends) and looked at again: it stays empty while
        -- its index changes. DROP INDEX then holds it exclusively for the
        -- rest of this short transaction; a lookup that plans it waits.
        EXECUTE format('SELECT EXISTS (SELECT FROM %s)', p) INTO holds;
        CONTINUE WHEN holds;
        EXECUTE format('LOCK TABLE %s IN SHARE MODE', p);
        EXECUTE format('SELECT EXISTS (SELECT FROM %s)', p) INTO holds;
        CONTINUE WHEN holds;
        name := (SELECT relname FROM pg_class WHERE oid = p) || '_request_digest';
        FOR old IN SELECT i.indexrelid::regclass AS idx, c.conname
                FROM pg_index i LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid
                WHERE i.indrelid = p AND i.indisunique AND NOT i.indisprimary
                  AND pg_get_indexdef(i.indexrelid) LIKE '%(tenant_id, request_id)%' LOOP
            IF old.conname IS NOT NULL THEN
                EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', p, old.conname);
            ELSE
                EXECUTE format('DROP INDEX %s', old.idx);
            END IF;
        END LOOP;
        -- Catalogue only: the partition has no page yet
        -- (docs/benchmarks.md, "A batched usage log": billing's updates
        -- are not HOT at 80 either, and a billed log costs less at 100).
        EXECUTE format('ALTER TABLE %s SET (fillfactor = 100)', p);
        IF NOT EXISTS (SELECT FROM pg_class WHERE relname = name AND relkind = 'i') THEN
            EXECUTE format('CREATE UNIQUE INDEX %I ON %s (tenant_id, (md5(request_id)::uuid)) WHERE request_id IS NOT NULL', name, p);
        END IF;
    END LOOP;
END
$$;
