-- usage_logs without a foreign key to tenants; tenants are never deleted.
--
-- Why. The foreign key's check runs once per inserted usage log (a lookup
-- and a KEY SHARE lock of the tenant's row): in a 20,000-row insert it took
-- 81 ms of 390 ms (EXPLAIN ANALYZE, "Trigger for constraint
-- usage_logs_tenant_id_fkey"), about a fifth of the ingest's main
-- statement, repeated for every event of every batch. It protected against
-- two things, both kept otherwise:
-- - a log naming no tenant: every writer of usage_logs already reads the
--   tenant in the same transaction (ingest joins the tenant's allowance
--   row, a correction copies its original's tenant);
-- - a tenant deleted under its logs: a usage log is a billing record, and
--   no command deletes a tenant (an operator suspends one). The trigger
--   below makes that a rule of the schema rather than of the code, so a
--   hand-typed DELETE or TRUNCATE cannot orphan billed usage.
--
-- Dropping a constraint and creating triggers change only the catalogue:
-- no row is read or rewritten, so this is instant on a table of millions
-- of rows. The lock_timeout keeps it from queueing the ingest behind a
-- long transaction; should it time out, run `overage migrate` again.
SET LOCAL lock_timeout = '5s';

ALTER TABLE usage_logs DROP CONSTRAINT IF EXISTS usage_logs_tenant_id_fkey;

CREATE FUNCTION tenants_refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'tenants are never deleted: their usage logs are billing records (suspend the tenant instead)'
        USING ERRCODE = 'restrict_violation';
END
$$;

CREATE TRIGGER tenants_refuse_delete BEFORE DELETE ON tenants
    FOR EACH ROW EXECUTE FUNCTION tenants_refuse_delete();
CREATE TRIGGER tenants_refuse_truncate BEFORE TRUNCATE ON tenants
    FOR EACH STATEMENT EXECUTE FUNCTION tenants_refuse_delete();
