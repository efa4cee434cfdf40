-- A usage log's overage on the default meters is written NULL from this
-- release when it equals the log's tokens (overage_input_tokens NULL:
-- equal to input_tokens; overage_output_tokens likewise), as meter_tokens
-- is when it equals meter_overage. It is so for every log once a
-- tenant's allowance is spent, and the two 8-byte values were 16 of a
-- batched log's 176 bytes of tuple (docs/benchmarks.md, "Overage NULL
-- when it equals the tokens"). Every read takes
-- coalesce(overage_input_tokens, input_tokens) (usagelog.OverageInputSQL,
-- OverageOutputSQL), and so must a query of your own: the columns'
-- comments say so. The counters' statement triggers read the same way
-- from now on (the functions below are those 0043 and 0020 made, with the
-- coalesce). Catalogue only: dropping NOT NULL reads and writes no row,
-- under a brief lock of the table and its partitions; a log written
-- before keeps its value, which the coalesce reads unchanged.
SET LOCAL lock_timeout = '5s';
ALTER TABLE usage_logs ALTER COLUMN overage_input_tokens DROP NOT NULL, ALTER COLUMN overage_output_tokens DROP NOT NULL;
COMMENT ON COLUMN usage_logs.overage_input_tokens IS 'overage on the default input meter; NULL when it equals input_tokens: read coalesce(overage_input_tokens, input_tokens)';
COMMENT ON COLUMN usage_logs.overage_output_tokens IS 'overage on the default output meter; NULL when it equals output_tokens: read coalesce(overage_output_tokens, output_tokens)';

CREATE OR REPLACE FUNCTION billing_counters_insert_rows()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO billing_counters AS c (tenant_id, billing_status, slot, usage_logs, overage_input_tokens, overage_output_tokens)
    SELECT n.tenant_id, n.billing_status, s,
           count(*), sum(coalesce(n.overage_input_tokens, n.input_tokens))::bigint, sum(coalesce(n.overage_output_tokens, n.output_tokens))::bigint
    FROM new_usage_logs n
    GROUP BY n.tenant_id, n.billing_status
    ORDER BY n.tenant_id, n.billing_status COLLATE "C"
    ON CONFLICT (tenant_id, billing_status, slot) DO UPDATE SET
        usage_logs            = c.usage_logs + EXCLUDED.usage_logs,
        overage_input_tokens  = c.overage_input_tokens + EXCLUDED.overage_input_tokens,
        overage_output_tokens = c.overage_output_tokens + EXCLUDED.overage_output_tokens;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION billing_counters_update_rows()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO billing_counters AS c (tenant_id, billing_status, slot, usage_logs, overage_input_tokens, overage_output_tokens)
    SELECT d.tenant_id, d.billing_status, s, sum(d.n)::bigint, sum(d.i)::bigint, sum(d.o)::bigint
    FROM (
        SELECT o.tenant_id, o.billing_status, -1 AS n, -coalesce(o.overage_input_tokens, o.input_tokens) AS i, -coalesce(o.overage_output_tokens, o.output_tokens) AS o
        FROM old_usage_logs o
        UNION ALL
        SELECT n.tenant_id, n.billing_status, 1, coalesce(n.overage_input_tokens, n.input_tokens), coalesce(n.overage_output_tokens, n.output_tokens)
        FROM new_usage_logs n
    ) AS d
    GROUP BY d.tenant_id, d.billing_status
    HAVING sum(d.n) <> 0 OR sum(d.i) <> 0 OR sum(d.o) <> 0
    ORDER BY d.tenant_id, d.billing_status COLLATE "C"
    ON CONFLICT (tenant_id, billing_status, slot) DO UPDATE SET
        usage_logs            = c.usage_logs + EXCLUDED.usage_logs,
        overage_input_tokens  = c.overage_input_tokens + EXCLUDED.overage_input_tokens,
        overage_output_tokens = c.overage_output_tokens + EXCLUDED.overage_output_tokens;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION billing_counters_delete_rows()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO billing_counters AS c (tenant_id, billing_status, slot, usage_logs, overage_input_tokens, overage_output_tokens)
    SELECT o.tenant_id, o.billing_status, s,
           -count(*), -sum(coalesce(o.overage_input_tokens, o.input_tokens))::bigint, -sum(coalesce(o.overage_output_tokens, o.output_tokens))::bigint
    FROM old_usage_logs o
    GROUP BY o.tenant_id, o.billing_status
    ORDER BY o.tenant_id, o.billing_status COLLATE "C"
    ON CONFLICT (tenant_id, billing_status, slot) DO UPDATE SET
        usage_logs            = c.usage_logs + EXCLUDED.usage_logs,
        overage_input_tokens  = c.overage_input_tokens + EXCLUDED.overage_input_tokens,
        overage_output_tokens = c.overage_output_tokens + EXCLUDED.overage_output_tokens;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION period_counters_insert_rows()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO period_counters AS c (tenant_id, period_start, meter, billing_status, slot, overage_tokens)
    SELECT d.tenant_id, d.period_start, d.meter, d.billing_status, s, sum(d.o)::bigint
    FROM (
        SELECT g.tenant_id, g.period_start, m.meter, g.billing_status, m.o
        FROM (
            SELECT n.tenant_id, n.period_start, n.billing_status, n.meter_keys,
                sum(coalesce(n.overage_input_tokens, n.input_tokens)) AS i, sum(coalesce(n.overage_output_tokens, n.output_tokens)) AS o,
                sum(n.meter_overage[array_lower(n.meter_overage, 1)]) AS o1,
                sum(n.meter_overage[array_lower(n.meter_overage, 1) + 1]) AS o2,
                sum(n.meter_overage[array_lower(n.meter_overage, 1) + 2]) AS o3,
                sum(n.meter_overage[array_lower(n.meter_overage, 1) + 3]) AS o4,
                sum(n.meter_overage[array_lower(n.meter_overage, 1) + 4]) AS o5
            FROM new_usage_logs n
            GROUP BY 1, 2, 3, 4
        ) AS g CROSS JOIN LATERAL (VALUES ('input'::text, g.i), ('output', g.o),
            (g.meter_keys[array_lower(g.meter_keys, 1)], g.o1), (g.meter_keys[array_lower(g.meter_keys, 1) + 1], g.o2),
            (g.meter_keys[array_lower(g.meter_keys, 1) + 2], g.o3), (g.meter_keys[array_lower(g.meter_keys, 1) + 3], g.o4),
            (g.meter_keys[array_lower(g.meter_keys, 1) + 4], g.o5)) AS m (meter, o)
        WHERE m.meter IS NOT NULL
        UNION ALL
        SELECT n.tenant_id, n.period_start, x.k, n.billing_status, x.o
        FROM new_usage_logs n, unnest(n.meter_keys, n.meter_overage) WITH ORDINALITY AS x (k, o, pos)
        WHERE cardinality(n.meter_keys) > 5 AND x.pos > 5
    ) AS d
    GROUP BY d.tenant_id, d.period_start, d.meter, d.billing_status
    HAVING sum(d.o) <> 0
    ORDER BY d.tenant_id, d.period_start, d.meter COLLATE "C", d.billing_status COLLATE "C"
    ON CONFLICT (tenant_id, period_start, meter, billing_status, slot) DO UPDATE SET
        overage_tokens = c.overage_tokens + EXCLUDED.overage_tokens;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION period_counters_update_rows()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO period_counters AS c (tenant_id, period_start, meter, billing_status, slot, overage_tokens)
    SELECT d.tenant_id, d.period_start, d.meter, d.billing_status, s, sum(d.o)::bigint
    FROM (
        SELECT g.tenant_id, g.period_start, m.meter, g.billing_status, m.o
        FROM (
            SELECT n.tenant_id, n.period_start, n.billing_status, n.meter_keys,
                -sum(coalesce(n.overage_input_tokens, n.input_tokens)) AS i, -sum(coalesce(n.overage_output_tokens, n.output_tokens)) AS o,
                -sum(n.meter_overage[array_lower(n.meter_overage, 1)]) AS o1,
                -sum(n.meter_overage[array_lower(n.meter_overage, 1) + 1]) AS o2,
                -sum(n.meter_overage[array_lower(n.meter_overage, 1) + 2]) AS o3,
                -sum(n.meter_overage[array_lower(n.meter_overage, 1) + 3]) AS o4,
                -sum(n.meter_overage[array_lower(n.meter_overage, 1) + 4]) AS o5
            FROM old_usage_logs n
            GROUP BY 1, 2, 3, 4
            UNION ALL
            SELECT n.tenant_id, n.period_start, n.billing_status, n.meter_keys,
                sum(coalesce(n.overage_input_tokens, n.input_tokens)), sum(coalesce(n.overage_output_tokens, n.output_tokens)),
                sum(n.meter_overage[array_lower(n.meter_overage, 1)]),
                sum(n.meter_overage[array_lower(n.meter_overage, 1) + 1]),
                sum(n.meter_overage[array_lower(n.meter_overage, 1) + 2]),
                sum(n.meter_overage[array_lower(n.meter_overage, 1) + 3]),
                sum(n.meter_overage[array_lower(n.meter_overage, 1) + 4])
            FROM new_usage_logs n
            GROUP BY 1, 2, 3, 4
        ) AS g CROSS JOIN LATERAL (VALUES ('input'::text, g.i), ('output', g.o),
            (g.meter_keys[array_lower(g.meter_keys, 1)], g.o1), (g.meter_keys[array_lower(g.meter_keys, 1) + 1], g.o2),
            (g.meter_keys[array_lower(g.meter_keys, 1) + 2], g.o3), (g.meter_keys[array_lower(g.meter_keys, 1) + 3], g.o4),
            (g.meter_keys[array_lower(g.meter_keys, 1) + 4], g.o5)) AS m (meter, o)
        WHERE m.meter IS NOT NULL
        UNION ALL
        SELECT o.tenant_id, o.period_start, x.k, o.billing_status, -x.o
        FROM old_usage_logs o, unnest(o.meter_keys, o.meter_overage) WITH ORDINALITY AS x (k, o, pos)
        WHERE cardinality(o.meter_keys) > 5 AND x.pos > 5
        UNION ALL
        SELECT n.tenant_id, n.period_start, x.k, n.billing_status, x.o
        FROM new_usage_logs n, unnest(n.meter_keys, n.meter_overage) WITH ORDINALITY AS x (k, o, pos)
        WHERE cardinality(n.meter_keys) > 5 AND x.pos > 5
    ) AS d
    GROUP BY d.tenant_id, d.period_start, d.meter, d.billing_status
    HAVING sum(d.o) <> 0
    ORDER BY d.tenant_id, d.period_start, d.meter COLLATE "C", d.billing_status COLLATE "C"
    ON CONFLICT (tenant_id, period_start, meter, billing_status, slot) DO UPDATE SET
        overage_tokens = c.overage_tokens + EXCLUDED.overage_tokens;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION period_counters_delete_rows()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO period_counters AS c (tenant_id, period_start, meter, billing_status, slot, overage_tokens)
    SELECT d.tenant_id, d.period_start, d.meter, d.billing_status, s, -sum(d.o)::bigint
    FROM (
        SELECT g.tenant_id, g.period_start, m.meter, g.billing_status, m.o
        FROM (
            SELECT o.tenant_id, o.period_start, o.billing_status, o.meter_keys,
                sum(coalesce(o.overage_input_tokens, o.input_tokens)) AS i, sum(coalesce(o.overage_output_tokens, o.output_tokens)) AS o,
                sum(o.meter_overage[array_lower(o.meter_overage, 1)]) AS o1,
                sum(o.meter_overage[array_lower(o.meter_overage, 1) + 1]) AS o2,
                sum(o.meter_overage[array_lower(o.meter_overage, 1) + 2]) AS o3,
                sum(o.meter_overage[array_lower(o.meter_overage, 1) + 3]) AS o4,
                sum(o.meter_overage[array_lower(o.meter_overage, 1) + 4]) AS o5
            FROM old_usage_logs o
            GROUP BY 1, 2, 3, 4
        ) AS g CROSS JOIN LATERAL (VALUES ('input'::text, g.i), ('output', g.o),
            (g.meter_keys[array_lower(g.meter_keys, 1)], g.o1), (g.meter_keys[array_lower(g.meter_keys, 1) + 1], g.o2),
            (g.meter_keys[array_lower(g.meter_keys, 1) + 2], g.o3), (g.meter_keys[array_lower(g.meter_keys, 1) + 3], g.o4),
            (g.meter_keys[array_lower(g.meter_keys, 1) + 4], g.o5)) AS m (meter, o)
        WHERE m.meter IS NOT NULL
        UNION ALL
        SELECT o.tenant_id, o.period_start, x.k, o.billing_status, x.o
        FROM old_usage_logs o, unnest(o.meter_keys, o.meter_overage) WITH ORDINALITY AS x (k, o, pos)
        WHERE cardinality(o.meter_keys) > 5 AND x.pos > 5
    ) AS d
    GROUP BY d.tenant_id, d.period_start, d.meter, d.billing_status
    HAVING sum(d.o) <> 0
    ORDER BY d.tenant_id, d.period_start, d.meter COLLATE "C", d.billing_status COLLATE "C"
    ON CONFLICT (tenant_id, period_start, meter, billing_status, slot) DO UPDATE SET
        overage_tokens = c.overage_tokens + EXCLUDED.overage_tokens;
    RETURN NULL;
END
$$;
