-- Retention (usagelog/rollups.go, package retention): the sums that stand
-- for usage logs once their partition is dropped.
--
-- usage_rollups: per tenant, UTC day of the usage (ts), meter, model and
-- billing day (the UTC day Stripe billed the line on: the usage day, or
-- for a log reported late — stripe_timestamp 'reported' — the day of its
-- report's timestamp, which is what reconciliation compares per day):
-- the logs, the tokens, the overage, the overage billed (what Stripe
-- accepted: the lines of billed logs) and the part of it reported late.
-- Every log has one row on each default meter (input, output, even at 0
-- tokens) and one on each other meter it feeds, so `logs` of the input
-- rows counts the logs once. Rows are only ever added to (+=): a day whose
-- logs lie in two partitions is summed by both roll-ups.
--
-- usage_rollup_partitions: one row per usage_logs partition rolled up,
-- written in the roll-up's transaction. below_id is the partition's upper
-- bound: every log with an id below the greatest below_id is counted in
-- usage_rollups and nowhere else (the watermark finance and reconcile
-- read). dropped_at is set once the partition and its reports' partition
-- are gone; a run interrupted in between finishes the drop.
--
-- usage_rollup_report_times: a report goes with its lead (its oldest
-- member); when the lead's partition is dropped while later members of
-- the report are kept, the report's timestamp (the day those late members
-- are billed on) is kept here.
--
-- Deployment: new, empty tables; nothing else is locked.
CREATE TABLE usage_rollups (
    tenant_id          uuid NOT NULL,
    day                date NOT NULL,
    meter              text NOT NULL,
    model_id           text NOT NULL,
    billing_day        date NOT NULL,
    logs               bigint NOT NULL,
    billed_logs        bigint NOT NULL,
    tokens             bigint NOT NULL,
    overage_tokens     bigint NOT NULL,
    billed_tokens      bigint NOT NULL,
    late_billed_tokens bigint NOT NULL,
    PRIMARY KEY (tenant_id, day, meter, model_id, billing_day)
);

-- Reconciliation reads billed overage by billing day.
CREATE INDEX usage_rollups_billing_day ON usage_rollups (billing_day);

COMMENT ON TABLE usage_rollups IS
    'sums of the usage logs of dropped partitions per tenant, usage day, meter, model and billing day (package retention)';

CREATE TABLE usage_rollup_partitions (
    partition         text PRIMARY KEY,
    reports_partition text,
    below_id          uuid NOT NULL,
    below_at          timestamptz NOT NULL,
    logs              bigint NOT NULL,
    rolled_up_at      timestamptz NOT NULL DEFAULT now(),
    dropped_at        timestamptz
);

CREATE INDEX usage_rollup_partitions_below ON usage_rollup_partitions (below_id);

COMMENT ON TABLE usage_rollup_partitions IS
    'usage_logs partitions rolled up into usage_rollups; the greatest below_id is the retention watermark';

CREATE TABLE usage_rollup_report_times (
    lead_usage_log_id uuid NOT NULL,
    dimension         text NOT NULL,
    ts                timestamptz NOT NULL,
    PRIMARY KEY (lead_usage_log_id, dimension)
);
