-- Day partitions made from now on index (tenant_id, md5(idempotency_key)::uuid)
-- instead of (tenant_id, idempotency_key): 64 bytes a record instead of
-- 101-127 (idempotency.KeyDigest says why). This moves the partitions
-- already made, a week ahead, and a new database's first partition, onto
-- the same index where that is cheap: a partition that holds no record
-- (all but the one or two that ingest writes now) swaps its index under a
-- brief lock, with nothing to read or build. A partition that holds records
-- keeps its index on the key until it is dropped, a day or two from now;
-- the lookups state both conditions, so either index serves them.
SET LOCAL lock_timeout = '5s';
DO $$
DECLARE
    p regclass;
    old record;
    holds boolean;
BEGIN
    FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'idempotency_keys'::regclass ORDER BY 1 LOOP
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
        FOR old IN SELECT i.indexrelid::regclass AS idx, c.conname
                FROM pg_index i LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid
                WHERE i.indrelid = p AND pg_get_indexdef(i.indexrelid) LIKE '%(tenant_id, idempotency_key)' LOOP
            IF old.conname IS NOT NULL THEN
                EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', p, old.conname);
            ELSE
                EXECUTE format('DROP INDEX %s', old.idx);
            END IF;
            EXECUTE format('CREATE UNIQUE INDEX %I ON %s (tenant_id, (md5(idempotency_key)::uuid))',
                (SELECT relname FROM pg_class WHERE oid = p) || '_key', p);
        END LOOP;
    END LOOP;
END
$$;
