-- Who made each correction: the id of the tenant's API key, or 'admin'
-- (ADMIN_TOKEN, `overage correct`). A nullable column without a default is
-- catalogue-only on a table of any size; corrections made before it, and
-- every log that is not a correction, have NULL.
SET LOCAL lock_timeout = '10s';
ALTER TABLE usage_logs ADD COLUMN corrected_by text;
