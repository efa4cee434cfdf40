-- Meters: per model and per kind of token.
--
-- The catalog. A meter is one Stripe Billing Meter overage reports to and
-- the tokens it counts: one token type, for the models its patterns match
-- (an exact model_id, a prefix ending in '*', or '*'). The two default
-- meters, 'input' and 'output', always exist; their event names are the
-- STRIPE_METER_*_EVENT settings, so they have none here. Meters are never
-- deleted, only archived: a usage log names the meters it fed by key for
-- as long as it is kept, and a key's token type never changes.
--
-- The referee for "two active meters of one token type with the same
-- pattern" is the partial unique index on meter_models, not a read before
-- the insert. meter_catalog.version is raised by every change of the
-- catalog in the same transaction, so an ingest transaction that reads it
-- knows whether the catalog it routed with is still the current one.
--
-- Usage logs. The two default meters keep the columns they always had
-- (overage_*_tokens, *_report_lead, *_accepted_at). Every other meter a log
-- feeds is one element of the meter_* arrays, NULL on a log that feeds
-- only the defaults (every log recorded before this migration), so the
-- columns are catalogue-only on a table of any size and a log of the
-- default meters costs nothing more. Reports keep their table; their
-- dimension is now a meter key.
--
-- Counters. allowance_usage keeps the default meters' period totals;
-- meter_usage holds the other meters', per slot like allowance_usage.
-- billing_counters keeps the default meters' overage per billing status;
-- every meter's overage per period and status is period_counters' (0041).
--
-- On a large table: new tables, nullable columns without defaults, a CHECK
-- replaced by one NOT VALID (a wider one, which every row passes), under
-- SHARE ROW EXCLUSIVE (writes wait a few milliseconds, reads do not).
SET LOCAL lock_timeout = '10s';
LOCK TABLE usage_logs IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE meters (
    key         text PRIMARY KEY CHECK (key ~ '^[a-z0-9_]{1,40}$'),
    event_name  text CHECK (event_name <> '' AND length(event_name) <= 100),
    token_type  text NOT NULL CHECK (token_type IN ('input', 'cache_read', 'cache_write', 'output', 'reasoning')),
    models      text[] NOT NULL CHECK (cardinality(models) > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    archived_at timestamptz,
    CHECK ((key IN ('input', 'output')) = (event_name IS NULL)),
    CHECK (key NOT IN ('input', 'output') OR archived_at IS NULL)
);
INSERT INTO meters (key, token_type, models) VALUES ('input', 'input', '{*}'), ('output', 'output', '{*}');

CREATE TABLE meter_models (
    meter      text NOT NULL REFERENCES meters (key),
    token_type text NOT NULL,
    pattern    text NOT NULL,
    archived   boolean NOT NULL DEFAULT false,
    PRIMARY KEY (meter, pattern)
);
CREATE UNIQUE INDEX meter_models_active ON meter_models (token_type, pattern) WHERE NOT archived;
INSERT INTO meter_models (meter, token_type, pattern) VALUES ('input', 'input', '*'), ('output', 'output', '*');

CREATE TABLE meter_catalog (
    one     boolean PRIMARY KEY DEFAULT true CHECK (one),
    version bigint NOT NULL
);
INSERT INTO meter_catalog (version) VALUES (1);

-- Allowances of the meters other than the defaults (which keep
-- included_input_tokens and included_output_tokens): {"<key>": N, ...}.
ALTER TABLE tenants ADD COLUMN included_meters jsonb NOT NULL DEFAULT '{}';

-- The overage columns are the default meters' lines now, not the
-- dimensions': on a log that feeds other meters too (meter_keys set) they
-- are bounded by the default lines' tokens, which the row does not hold,
-- not by the dimension's. The check is replaced by one that exempts such
-- logs, NOT VALID (every existing row passes: none has meter_keys) and
-- validated by 0039 without blocking writes.
ALTER TABLE usage_logs
    ADD COLUMN meter_keys text[],
    ADD COLUMN meter_tokens bigint[],
    ADD COLUMN meter_overage bigint[],
    ADD COLUMN meter_leads uuid[],
    ADD COLUMN meter_accepted_at timestamptz[],
    DROP CONSTRAINT usage_logs_tokens_check,
    ADD CONSTRAINT usage_logs_tokens_check CHECK (
        (corrects IS NOT NULL OR (input_tokens >= 0 AND output_tokens >= 0))
        AND (meter_keys IS NOT NULL OR (
            overage_input_tokens BETWEEN least(0, input_tokens) AND greatest(0, input_tokens)
            AND overage_output_tokens BETWEEN least(0, output_tokens) AND greatest(0, output_tokens)))
        AND (corrects IS NULL) = (correction_reason IS NULL)
        AND cardinality(meter_keys) = cardinality(meter_tokens)
        AND cardinality(meter_keys) = cardinality(meter_overage)
    ) NOT VALID;

ALTER TABLE usage_reports DROP CONSTRAINT usage_reports_dimension_check,
    ADD CONSTRAINT usage_reports_meter_key CHECK (dimension ~ '^[a-z0-9_]{1,40}$') NOT VALID;

CREATE TABLE meter_usage (
    tenant_id    uuid NOT NULL,
    period_start timestamptz NOT NULL,
    meter        text NOT NULL,
    slot         smallint NOT NULL,
    tokens       bigint NOT NULL,
    PRIMARY KEY (tenant_id, period_start, meter, slot)
);
