-- Reports (package usagelog): one Stripe meter event carries the overage of
-- one dimension of many pending usage logs of a tenant, allowance period and
-- UTC day. A report's members, value and timestamp are written here before
-- its first send and never change; its identifier and Idempotency-Key are
-- usage-log:<lead_usage_log_id>:<dimension>, so the primary key is also the
-- referee of "one meter event per identifier".
--
-- Deployment on a large table: usage_reports and report_batches are new and
-- empty. The two
-- columns added to usage_logs are nullable without a default, so ADD COLUMN
-- only changes the catalog (no rewrite, no scan); no index is built on
-- usage_logs (a report finds its members through member_ids and the primary
-- key). The ACCESS EXCLUSIVE lock of ALTER TABLE lasts that instant,
-- bounded by lock_timeout so the migration gives up instead of stalling
-- ingest behind a long transaction (nothing is applied; run it again).

SET LOCAL lock_timeout = '10s';

-- The lead of the report that carries each dimension of the log; NULL until
-- the log joins one. Set once, in the transaction that forms the report: a
-- log is in at most one report per dimension.
ALTER TABLE usage_logs
    ADD COLUMN input_report_lead uuid,
    ADD COLUMN output_report_lead uuid;

CREATE TABLE usage_reports (
    lead_usage_log_id uuid NOT NULL,
    dimension         text NOT NULL CHECK (dimension IN ('input', 'output')),
    tenant_id         uuid NOT NULL REFERENCES tenants (id),
    period_start      timestamptz NOT NULL,
    usage_day         date NOT NULL,
    -- The sum of the members' overage of this dimension: payload[value].
    value             bigint NOT NULL,
    -- The latest usage timestamp among the members: the event's timestamp.
    ts                timestamptz NOT NULL,
    member_ids        uuid[] NOT NULL CHECK (cardinality(member_ids) > 0),
    -- open: to be sent (again); accepted: Stripe holds it (or it summed to
    -- zero and was never sent); needs_review: past Stripe's idempotency
    -- window, an operator decides; failed: Stripe refused it for good;
    -- void: an operator decided it is never billed.
    state             text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'accepted', 'needs_review', 'failed', 'void')),
    -- Committed before the first send: the window guard counts from it.
    first_attempt_at  timestamptz NOT NULL,
    -- A worker sending the report holds it until then, so two report jobs
    -- of one tenant do not send it at once; a killed worker's lease lapses.
    lease_until       timestamptz,
    accepted_at       timestamptz,
    message           text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (lead_usage_log_id, dimension)
);
-- Report jobs pick up their tenant's open reports; the sweep finds open
-- reports past the window. The partial index stays as small as the backlog.
CREATE INDEX usage_reports_open ON usage_reports (tenant_id, created_at) WHERE state = 'open';

COMMENT ON TABLE usage_reports IS
    'one Stripe meter event each: one dimension of one or more usage logs of a tenant, period and UTC day; members and value fixed before the first send';

-- One row per (tenant, batch period) whose report job an ingest transaction
-- queued: the first transaction of a period inserts it and the River job;
-- the others find the row (ON CONFLICT DO NOTHING writes nothing) and skip
-- River's unique insert, which would rewrite the period's job row in every
-- ingest transaction of the tenant. The report job deletes its tenant's
-- rows of past periods when it runs.
CREATE TABLE report_batches (
    tenant_id uuid NOT NULL,
    batch     timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, batch)
);
