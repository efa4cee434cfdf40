-- Stripe webhooks (package webhooks): every verified event, its processing
-- state, the subscription periods it told us, tenant suspension and the
-- meter error reports finance reads.
--
-- Deployment on a large table: the new tables are created empty. The two
-- columns added to tenants are nullable without a default, so ADD COLUMN
-- only changes the catalog (no rewrite); it takes an ACCESS EXCLUSIVE lock
-- for that instant, bounded by lock_timeout so the migration gives up
-- instead of stalling ingest behind a long transaction (nothing is applied;
-- run it again).

SET LOCAL lock_timeout = '10s';

-- One row per (event id, receiving account). seq is the arrival order; the
-- processing worker applies events strictly by it. processed_at is the record
-- of "done" (River's unique jobs are only "seen", and not for long).
CREATE TABLE stripe_webhook_events (
    seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        text NOT NULL CHECK (event_id <> ''),
    -- The event's `account` (Stripe Connect), else 'platform'.
    account         text NOT NULL CHECK (account <> ''),
    type            text NOT NULL,
    -- The API version Stripe rendered `data` with; events of any version are
    -- accepted and only the fields the processor needs are read.
    api_version     text,
    livemode        boolean NOT NULL DEFAULT false,
    -- Stripe's `created` of the event.
    event_created   timestamptz,
    payload         jsonb NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    processed_at    timestamptz,
    -- What processing did: 'applied', 'ignored', 'no tenant', or an error
    -- that retrying cannot fix (the event is then acknowledged, not retried).
    process_outcome text
);
CREATE UNIQUE INDEX stripe_webhook_events_event_account ON stripe_webhook_events (event_id, account);
-- The processor's queue: as small as the backlog.
CREATE INDEX stripe_webhook_events_unprocessed ON stripe_webhook_events (seq) WHERE processed_at IS NULL;
-- Retention deletes by age.
CREATE INDEX stripe_webhook_events_received_at ON stripe_webhook_events (received_at);

-- A tenant's Stripe subscriptions, as the webhooks last told us. When one
-- covers a usage timestamp, the allowance period is its current period
-- instead of the calendar month (ingest).
CREATE TABLE tenant_subscriptions (
    tenant_id              uuid NOT NULL REFERENCES tenants (id),
    stripe_subscription_id text NOT NULL,
    status                 text NOT NULL,
    current_period_start   timestamptz NOT NULL,
    current_period_end     timestamptz NOT NULL,
    -- Stripe's `created` of the event last applied: an older event that
    -- arrives later never overwrites a newer state.
    event_created          timestamptz NOT NULL,
    updated_at             timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, stripe_subscription_id),
    CHECK (current_period_start < current_period_end)
);
CREATE INDEX tenant_subscriptions_period ON tenant_subscriptions (tenant_id, current_period_start);

-- customer.deleted suspends the tenant: its reports fail with this reason
-- instead of being retried against a customer Stripe no longer has.
ALTER TABLE tenants ADD COLUMN suspended_at timestamptz, ADD COLUMN suspended_reason text;

-- billing.meter.error_report_triggered: Stripe could not apply meter events.
CREATE TABLE meter_error_reports (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_seq     bigint NOT NULL,
    event_id      text NOT NULL,
    account       text NOT NULL,
    meter_id      text,
    summary       text,
    error_count   bigint,
    reported_at   timestamptz,
    details       jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (event_id, account)
);
