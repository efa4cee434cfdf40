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
-- meter_counters the other meters', maintained by statement triggers of
-- their own beside billing_counters' (same transition tables, same slot
-- setting, rows taken in (tenant, status, meter) order within a statement).
--
-- On a large table: new tables, nullable columns without defaults, a CHECK
-- replaced by one NOT VALID (a wider one, which every row passes), and
-- triggers added under SHARE ROW EXCLUSIVE (writes wait a few
-- milliseconds, reads do not), so every write is counted by exactly one
-- generation of triggers.
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

CREATE TABLE meter_counters (
    tenant_id      uuid NOT NULL,
    billing_status text NOT NULL,
    meter          text NOT NULL,
    slot           smallint NOT NULL,
    overage_tokens bigint NOT NULL,
    PRIMARY KEY (tenant_id, billing_status, meter, slot)
) WITH (fillfactor = 50);

COMMENT ON TABLE meter_counters IS
    'overage per tenant, billing_status and meter other than the defaults, of the usage_logs meter_* arrays; maintained by statement triggers on usage_logs';

CREATE FUNCTION meter_counters_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO meter_counters AS c (tenant_id, billing_status, meter, slot, overage_tokens)
        SELECT n.tenant_id, n.billing_status, x.k, s, sum(x.o)::bigint
        FROM new_usage_logs n CROSS JOIN LATERAL unnest(n.meter_keys, n.meter_overage) AS x (k, o)
        WHERE n.meter_keys IS NOT NULL
        GROUP BY n.tenant_id, n.billing_status, x.k
        ORDER BY n.tenant_id, n.billing_status COLLATE "C", x.k COLLATE "C"
        ON CONFLICT (tenant_id, billing_status, meter, slot) DO UPDATE SET overage_tokens = c.overage_tokens + EXCLUDED.overage_tokens;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO meter_counters AS c (tenant_id, billing_status, meter, slot, overage_tokens)
        SELECT d.tenant_id, d.billing_status, d.k, s, sum(d.o)::bigint
        FROM (
            SELECT o.tenant_id, o.billing_status, x.k, -x.o AS o
            FROM old_usage_logs o CROSS JOIN LATERAL unnest(o.meter_keys, o.meter_overage) AS x (k, o)
            WHERE o.meter_keys IS NOT NULL
            UNION ALL
            SELECT n.tenant_id, n.billing_status, x.k, x.o
            FROM new_usage_logs n CROSS JOIN LATERAL unnest(n.meter_keys, n.meter_overage) AS x (k, o)
            WHERE n.meter_keys IS NOT NULL
        ) AS d
        GROUP BY d.tenant_id, d.billing_status, d.k
        HAVING sum(d.o) <> 0
        ORDER BY d.tenant_id, d.billing_status COLLATE "C", d.k COLLATE "C"
        ON CONFLICT (tenant_id, billing_status, meter, slot) DO UPDATE SET overage_tokens = c.overage_tokens + EXCLUDED.overage_tokens;
    ELSE
        INSERT INTO meter_counters AS c (tenant_id, billing_status, meter, slot, overage_tokens)
        SELECT o.tenant_id, o.billing_status, x.k, s, -sum(x.o)::bigint
        FROM old_usage_logs o CROSS JOIN LATERAL unnest(o.meter_keys, o.meter_overage) AS x (k, o)
        WHERE o.meter_keys IS NOT NULL
        GROUP BY o.tenant_id, o.billing_status, x.k
        ORDER BY o.tenant_id, o.billing_status COLLATE "C", x.k COLLATE "C"
        ON CONFLICT (tenant_id, billing_status, meter, slot) DO UPDATE SET overage_tokens = c.overage_tokens + EXCLUDED.overage_tokens;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER usage_logs_meter_counters_insert
    AFTER INSERT ON usage_logs
    REFERENCING NEW TABLE AS new_usage_logs
    FOR EACH STATEMENT EXECUTE FUNCTION meter_counters_rows();

CREATE TRIGGER usage_logs_meter_counters_update
    AFTER UPDATE ON usage_logs
    REFERENCING OLD TABLE AS old_usage_logs NEW TABLE AS new_usage_logs
    FOR EACH STATEMENT EXECUTE FUNCTION meter_counters_rows();

CREATE TRIGGER usage_logs_meter_counters_delete
    AFTER DELETE ON usage_logs
    REFERENCING OLD TABLE AS old_usage_logs
    FOR EACH STATEMENT EXECUTE FUNCTION meter_counters_rows();

CREATE FUNCTION meter_counters_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM meter_counters;
    RETURN NULL;
END
$$;

CREATE TRIGGER usage_logs_meter_counters_truncate
    AFTER TRUNCATE ON usage_logs
    FOR EACH STATEMENT EXECUTE FUNCTION meter_counters_truncate();
