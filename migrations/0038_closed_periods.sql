-- Late usage and closed billing periods (usagelog.PeriodClosedSQL).
--
-- usage_logs.stripe_timestamp says which time the log's meter events carry:
-- 'usage' (its usage timestamp) or 'reported' (the time its report was
-- formed: the log's period was closed then, so its usage timestamp would
-- land on an invoice Stripe no longer changes). Written by the transaction
-- that forms the log's reports, with the report's timestamp; NULL until
-- then, and on logs never reported (not_billable).
--
-- closed_periods: Stripe's invoice.finalized of a tenant's subscription
-- invoice. Every allowance period of the tenant that began before the
-- invoice's period_end is closed, even inside PERIOD_CLOSE_GRACE.
--
-- Deployment on a large table: a nullable column without a default is
-- catalogue-only (no rewrite, no scan); its ACCESS EXCLUSIVE lock lasts
-- that instant, bounded by lock_timeout (nothing is applied; run it
-- again). The new table is created empty.
SET LOCAL lock_timeout = '10s';

-- The CHECK is NOT VALID: enforced on every write from now on, with no
-- scan of the existing rows (all NULL).
ALTER TABLE usage_logs ADD COLUMN stripe_timestamp text,
    ADD CONSTRAINT usage_logs_stripe_timestamp CHECK (stripe_timestamp IN ('usage', 'reported')) NOT VALID;

CREATE TABLE closed_periods (
    tenant_id         uuid NOT NULL REFERENCES tenants (id),
    stripe_invoice_id text NOT NULL CHECK (stripe_invoice_id <> ''),
    -- The invoice's usage period.
    period_start      timestamptz NOT NULL,
    period_end        timestamptz NOT NULL,
    -- Stripe's `created` of the invoice.finalized event.
    event_created     timestamptz NOT NULL,
    closed_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, stripe_invoice_id)
);
CREATE INDEX closed_periods_end ON closed_periods (tenant_id, period_end);
