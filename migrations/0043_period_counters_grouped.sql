-- The period_counters triggers (0041) without a subquery per row.
--
-- Each trigger expands every log of its statement into one row per meter
-- line — the two default meters' columns and each element of meter_keys /
-- meter_overage — and sums those rows per tenant, period, meter and
-- status. Expanding a row is a LATERAL subquery run once per log (an
-- Append over two constant rows and an unnest), whose executor overhead,
-- not the sums, was the trigger's cost: about 2.5 ms for 1,000 logs of
-- three meter lines, 1.2 ms for 1,000 of the defaults (backend CPU).
--
-- Here the logs are summed first, per (tenant, period, status, meter_keys)
-- — the logs of one catalog and model share their keys, so a statement has
-- a few such groups — with the overage of the first five lines summed by
-- position, and only the groups are expanded into meter rows. A log has at
-- most five lines beyond the defaults, one per kind of token, when it
-- was routed with one catalog; a correction's may name more (meters that
-- only give back a share), and the lines past the fifth are taken from
-- the log itself with unnest. Positions are read from each array's own
-- lower bound, so the sums equal unnest's pairing of keys and overage for
-- any array the CHECK of 0031 admits. The result is the same rows and
-- totals, upserted in the same order and slot, for about 0.9 ms and 0.6 ms
-- (docs/benchmarks.md, "Meters").
--
-- CREATE OR REPLACE FUNCTION replaces 0041's bodies in place: it takes no
-- lock on usage_logs, and a statement already running keeps the body it
-- started with, so this is safe while serve and work write.

CREATE OR REPLACE FUNCTION period_counters_insert_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO period_counters AS c (tenant_id, period_start, meter, billing_status, slot, overage_tokens)
    SELECT d.tenant_id, d.period_start, d.meter, d.billing_status, s, sum(d.o)::bigint
    FROM (
        SELECT g.tenant_id, g.period_start, m.meter, g.billing_status, m.o
        FROM (
            SELECT n.tenant_id, n.period_start, n.billing_status, n.meter_keys,
                sum(n.overage_input_tokens) AS i, sum(n.overage_output_tokens) AS o,
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

CREATE OR REPLACE FUNCTION period_counters_update_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO period_counters AS c (tenant_id, period_start, meter, billing_status, slot, overage_tokens)
    SELECT d.tenant_id, d.period_start, d.meter, d.billing_status, s, sum(d.o)::bigint
    FROM (
        SELECT g.tenant_id, g.period_start, m.meter, g.billing_status, m.o
        FROM (
            SELECT n.tenant_id, n.period_start, n.billing_status, n.meter_keys,
                -sum(n.overage_input_tokens) AS i, -sum(n.overage_output_tokens) AS o,
                -sum(n.meter_overage[array_lower(n.meter_overage, 1)]) AS o1,
                -sum(n.meter_overage[array_lower(n.meter_overage, 1) + 1]) AS o2,
                -sum(n.meter_overage[array_lower(n.meter_overage, 1) + 2]) AS o3,
                -sum(n.meter_overage[array_lower(n.meter_overage, 1) + 3]) AS o4,
                -sum(n.meter_overage[array_lower(n.meter_overage, 1) + 4]) AS o5
            FROM old_usage_logs n
            GROUP BY 1, 2, 3, 4
            UNION ALL
            SELECT n.tenant_id, n.period_start, n.billing_status, n.meter_keys,
                sum(n.overage_input_tokens), sum(n.overage_output_tokens),
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

CREATE OR REPLACE FUNCTION period_counters_delete_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO period_counters AS c (tenant_id, period_start, meter, billing_status, slot, overage_tokens)
    SELECT d.tenant_id, d.period_start, d.meter, d.billing_status, s, -sum(d.o)::bigint
    FROM (
        SELECT g.tenant_id, g.period_start, m.meter, g.billing_status, m.o
        FROM (
            SELECT o.tenant_id, o.period_start, o.billing_status, o.meter_keys,
                sum(o.overage_input_tokens) AS i, sum(o.overage_output_tokens) AS o,
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
