-- Usage log partitions made from now on index one 16-byte column, the
-- digest of tenant and request_id, md5(tenant_id::text || request_id)::uuid
-- (`<partition>_request_key`, AddPartition, usagelog.RequestKeySQL),
-- instead of (tenant_id, md5(request_id)::uuid) (0061): 28 bytes an entry
-- with its line pointer instead of 44, and fewer leaves for the random
-- inserts to dirty and the lookups to miss (docs/benchmarks.md, "One
-- digest of tenant and request_id"). As 0061 did, this moves the
-- partitions that hold no log (the months made ahead, and a new
-- database's partitions) onto the new index under a brief lock, with
-- nothing to read or build. A partition that holds logs keeps its index
-- (0061's, or the one on (tenant_id, request_id) from before) until it is
-- dropped; the lookups state every index's condition
-- (usagelog.RequestIDIs), so each partition uses the index it has.
SET LOCAL lock_timeout = '5s';
DO $$
DECLARE
    p regclass;
    old record;
    holds boolean;
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
        -- The unique indexes on request_id of the two earlier shapes, and
        -- nothing else (the primary key stays).
        FOR old IN SELECT i.indexrelid::regclass AS idx, c.conname
                FROM pg_index i LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid
                WHERE i.indrelid = p AND i.indisunique AND NOT i.indisprimary
                  AND (pg_get_indexdef(i.indexrelid) LIKE '%(tenant_id, request_id)%'
                    OR pg_get_indexdef(i.indexrelid) LIKE '%(tenant_id, ((md5(request_id))::uuid))%') LOOP
            IF old.conname IS NOT NULL THEN
                EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', p, old.conname);
            ELSE
                EXECUTE format('DROP INDEX %s', old.idx);
            END IF;
        END LOOP;
        -- Its own index already (a partition made by the code of 0067
        -- before this ran): nothing to make.
        CONTINUE WHEN EXISTS (SELECT FROM pg_index i WHERE i.indrelid = p AND i.indisunique
            AND pg_get_indexdef(i.indexrelid) LIKE '%(((md5(((tenant_id)::text || request_id)))::uuid))%');
        EXECUTE format('CREATE UNIQUE INDEX %I ON %s ((md5(tenant_id::text || request_id)::uuid)) WHERE request_id IS NOT NULL',
            (SELECT relname FROM pg_class WHERE oid = p) || '_request_key', p);
    END LOOP;
END
$$;
