-- Step 2: check the existing records against the bound. VALIDATE reads the
-- table under SHARE UPDATE EXCLUSIVE, which lets ingest read and write
-- meanwhile; the check is what lets 0027 attach the table as a partition
-- without reading it again under an exclusive lock.
ALTER TABLE idempotency_keys VALIDATE CONSTRAINT idempotency_keys_before_bound;
