-- Packing a month now rewrites its heap too (usagelog.PackPartition):
-- billing updates every log twice, almost never HOT, so a billed month's
-- heap keeps a third of its pages empty after VACUUM, and only a rewrite
-- gives that space back. The month is copied into a new table beside it
-- and swapped in for it in one short transaction; writes made to the
-- month during the copy are recorded by a row trigger (this function)
-- into a table of changed ids that the swap copies again.
--
-- Catalogue only: two nullable columns on a small table, one function.

-- usage_log_pack_capture records the id of each log written while its
-- partition is copied, into the table named by the trigger's argument.
CREATE FUNCTION usage_log_pack_capture() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('INSERT INTO %I (id) VALUES ($1)', TG_ARGV[0])
        USING CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION usage_log_pack_capture() IS 'row trigger of a usage_logs partition while usagelog.PackPartition copies it: records the ids written meanwhile, which the swap copies again';

-- The heap's size (pg_table_size of the logs' partition) before and
-- after its rewrite; NULL on a pack made before 0071 (indexes only),
-- which retention then packs once more.
ALTER TABLE usage_log_packs ADD COLUMN heap_bytes_before bigint, ADD COLUMN heap_bytes_after bigint;
