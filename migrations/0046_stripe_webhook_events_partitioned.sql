-- Step 3: the partitioned table takes the name, today's table becomes its
-- partition for everything received before the bound, in one short
-- transaction (renames and catalogue changes only: nothing is read or
-- copied). A statement prepared by a running server resolves the name
-- again and goes on against the new table.
--
-- seq stays the arrival order: a partitioned table cannot have an identity
-- column (PostgreSQL 15), so the identity becomes a plain sequence that
-- goes on from the identity's last value, read under this lock, and the
-- partitioned table's default. The legacy partition keeps its primary key
-- on seq.
--
-- The partitioned table has no unique index of its own: one there would
-- have to include received_at and would referee nothing. Each partition
-- has its own unique index on (event_id, account), made by the webhooks
-- package when it creates the partition, so within a month the index is
-- the referee; across months the store takes a transaction lock on the
-- event before it looks for it, so two deliveries of one event are
-- serialised and the second finds the first in whichever month it is.
--
-- A server of the previous version stores with ON CONFLICT (event_id,
-- account), which no index of the partitioned table matches: from here on
-- it answers 500 and Stripe retries the delivery until a server of this
-- version stores it. Deploy this version's serve before migrating.
--
-- The partitions from the bound on are created by `overage migrate` right
-- after this file and by `overage work` (the webhook reaper, every 10
-- minutes), two months ahead.
SET LOCAL lock_timeout = '10s';
LOCK TABLE stripe_webhook_events IN ACCESS EXCLUSIVE MODE;

DO $$
DECLARE
    last bigint := coalesce(pg_sequence_last_value(pg_get_serial_sequence('stripe_webhook_events', 'seq')::regclass), 0);
BEGIN
    ALTER TABLE stripe_webhook_events ALTER COLUMN seq DROP IDENTITY;
    EXECUTE format('CREATE SEQUENCE stripe_webhook_events_seq_seq AS bigint START %s', last + 1);
END
$$;

ALTER TABLE stripe_webhook_events RENAME TO stripe_webhook_events_legacy;
ALTER INDEX stripe_webhook_events_pkey RENAME TO stripe_webhook_events_legacy_pkey;
ALTER INDEX stripe_webhook_events_event_account RENAME TO stripe_webhook_events_legacy_event_account;
ALTER INDEX stripe_webhook_events_unprocessed RENAME TO stripe_webhook_events_legacy_unprocessed;
-- Read only by the row-by-row retention that partitions replace.
DROP INDEX stripe_webhook_events_received_at;

CREATE TABLE stripe_webhook_events (
    seq             bigint NOT NULL DEFAULT nextval('stripe_webhook_events_seq_seq'),
    event_id        text NOT NULL CONSTRAINT stripe_webhook_events_event_id_check CHECK (event_id <> ''),
    account         text NOT NULL CONSTRAINT stripe_webhook_events_account_check CHECK (account <> ''),
    type            text NOT NULL,
    api_version     text,
    livemode        boolean NOT NULL DEFAULT false,
    event_created   timestamptz,
    payload         jsonb NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    processed_at    timestamptz,
    process_outcome text
) PARTITION BY RANGE (received_at);
ALTER SEQUENCE stripe_webhook_events_seq_seq OWNED BY stripe_webhook_events.seq;

COMMENT ON TABLE stripe_webhook_events IS
    'verified Stripe events, one per (event_id, account), partitioned by receipt month; partitions 365 days old and fully processed are dropped whole by overage work';

DO $$
BEGIN
    EXECUTE format('ALTER TABLE stripe_webhook_events ATTACH PARTITION stripe_webhook_events_legacy FOR VALUES FROM (MINVALUE) TO (%L)',
        (SELECT bound FROM overage_stripe_webhook_events_bound));
END
$$;

-- The processor's queue, in every partition: as small as the backlog. The
-- legacy table's index is attached, not built.
CREATE INDEX stripe_webhook_events_unprocessed ON ONLY stripe_webhook_events (seq) WHERE processed_at IS NULL;
ALTER INDEX stripe_webhook_events_unprocessed ATTACH PARTITION stripe_webhook_events_legacy_unprocessed;

DROP TABLE overage_stripe_webhook_events_bound;
