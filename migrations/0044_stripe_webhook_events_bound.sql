-- Stripe webhook events move to a table partitioned by receipt month, so
-- that a year-old month goes by dropping its partition instead of by
-- deleting its rows (0044-0046, on a live system, as 0025-0027 moved the
-- idempotency records).
--
-- Step 1: bound today's table. Every event is stored at now()
-- (received_at's default), so every event a running server (old or new
-- code) stores during the next month is below `bound`, the start of the
-- UTC month after next. The constraint is NOT VALID: it holds for new rows
-- at once, without reading the existing ones under this lock (0045
-- validates them without blocking writes). The table then becomes the
-- first partition, for everything before `bound` (0046); it is dropped
-- whole once `bound` is 365 days past and every event in it is processed.
SET LOCAL lock_timeout = '10s';

CREATE TABLE overage_stripe_webhook_events_bound (bound timestamptz NOT NULL);
INSERT INTO overage_stripe_webhook_events_bound SELECT date_trunc('month', now(), 'UTC') + interval '2 months';

DO $$
BEGIN
    EXECUTE format('ALTER TABLE stripe_webhook_events ADD CONSTRAINT stripe_webhook_events_before_bound CHECK (received_at < %L) NOT VALID',
        (SELECT bound FROM overage_stripe_webhook_events_bound));
END
$$;
