-- Usage alerts: a tenant's notification endpoint and thresholds, the
-- threshold events ingest records, and each delivery attempt.
--
-- tenants gets three nullable columns without a default: catalogue-only
-- on a table of any size (no rewrite, no scan). The new tables start
-- empty. lock_timeout bounds the wait for the brief ACCESS EXCLUSIVE lock
-- ALTER TABLE takes on tenants; on timeout nothing was applied and the
-- migration can be run again.
SET LOCAL lock_timeout = '10s';

ALTER TABLE tenants
    -- Where threshold events are POSTed; NULL: none are delivered.
    ADD COLUMN alert_url text,
    -- The HMAC-SHA256 key of Overage-Signature (whsec_...). Kept in clear:
    -- signing needs it. Shown once, when the URL is set.
    ADD COLUMN alert_secret text,
    -- Percentages (1 to 100) of each meter's allowance; NULL or empty: no
    -- events.
    ADD COLUMN alert_thresholds smallint[];

-- One row per tenant x meter x period x threshold, ever: the unique
-- constraint is what makes an event exactly once, however the usage that
-- crossed it arrived or raced (ingest inserts with ON CONFLICT DO NOTHING).
CREATE TABLE alert_events (
    id                uuid PRIMARY KEY,              -- uuid v7: newest first is id order
    tenant_id         uuid NOT NULL,
    meter             text NOT NULL,                 -- the meter key: input, output, ...
    period_start      timestamptz NOT NULL,
    threshold_percent smallint NOT NULL CHECK (threshold_percent BETWEEN 1 AND 100),
    included          bigint NOT NULL,
    used              bigint NOT NULL,               -- the period's total after the crossing transaction
    created_at        timestamptz NOT NULL DEFAULT now(),
    delivery_status   text NOT NULL DEFAULT 'pending'
                      CHECK (delivery_status IN ('pending', 'delivered', 'failed', 'no_endpoint')),
    attempts          integer NOT NULL DEFAULT 0,
    delivered_at      timestamptz,
    failed_at         timestamptz,
    last_error        text,
    next_attempt_at   timestamptz,
    -- A delivery in flight holds the lease until this time: no second
    -- delivery of the event starts before it passes (a rescued job, say).
    lease_until       timestamptz,
    CONSTRAINT alert_events_once UNIQUE (tenant_id, meter, period_start, threshold_percent)
);
CREATE INDEX alert_events_tenant ON alert_events (tenant_id, id DESC);
CREATE INDEX alert_events_failing ON alert_events (delivery_status) WHERE delivery_status IN ('pending', 'failed');

-- Every delivery attempt and its outcome.
CREATE TABLE alert_deliveries (
    event_id    uuid NOT NULL REFERENCES alert_events (id) ON DELETE CASCADE,
    attempt     integer NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    status_code integer,                             -- NULL: no HTTP answer (timeout, refused)
    outcome     text NOT NULL CHECK (outcome IN ('delivered', 'retry', 'failed')),
    error       text,
    PRIMARY KEY (event_id, attempt)
);
