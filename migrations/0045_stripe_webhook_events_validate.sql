-- Step 2: check the existing events against the bound. VALIDATE reads the
-- table under SHARE UPDATE EXCLUSIVE, which lets deliveries and the
-- processor read and write meanwhile; the check is what lets 0046 attach
-- the table as a partition without reading it again under an exclusive
-- lock.
ALTER TABLE stripe_webhook_events VALIDATE CONSTRAINT stripe_webhook_events_before_bound;
