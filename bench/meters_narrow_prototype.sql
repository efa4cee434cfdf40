-- A prototype of the narrower layout of a log's meter lines (docs/
-- benchmarks.md, "A narrower layout of the lines"), for a SCRATCH database
-- only: run on a fresh `overage migrate` + bench/setup.sql database with
-- the three meters of bench/meters.lib.sh, it replaces meter_keys,
-- meter_tokens and meter_overage by meter_ids smallint[] and meter_lines
-- bigint[] (each line's tokens, then its overage) and the period_counters
-- insert trigger by one reading them. Nothing else (reads, billing, the
-- other triggers) knows the new columns: it is for measuring the insert
-- of usagelog.InsertSQL with the ids and pairs as its flat arguments
-- ($17 smallint[] sliced [lo+1 : lo+cnt], $18 bigint[] sliced
-- [2lo+1 : 2(lo+cnt)]) against today's, not a migration.
ALTER TABLE meters ADD COLUMN id smallint UNIQUE;
UPDATE meters SET id = CASE key WHEN 'input' THEN 1 WHEN 'output' THEN 2 WHEN 'm_input' THEN 3 WHEN 'm_cache' THEN 4 WHEN 'm_output' THEN 5 END;
ALTER TABLE usage_logs DROP CONSTRAINT usage_logs_tokens_check;
ALTER TABLE usage_logs DROP COLUMN meter_keys, DROP COLUMN meter_tokens, DROP COLUMN meter_overage;
ALTER TABLE usage_logs ADD COLUMN meter_ids smallint[], ADD COLUMN meter_lines bigint[];
ALTER TABLE usage_logs ADD CONSTRAINT usage_logs_tokens_check CHECK (
    (corrects IS NOT NULL OR (input_tokens >= 0 AND output_tokens >= 0))
    AND (meter_ids IS NOT NULL OR (
        overage_input_tokens BETWEEN least(0, input_tokens) AND greatest(0, input_tokens)
        AND overage_output_tokens BETWEEN least(0, output_tokens) AND greatest(0, output_tokens)))
    AND (corrects IS NULL) = (correction_reason IS NULL)
    AND 2 * cardinality(meter_ids) = cardinality(meter_lines));
CREATE OR REPLACE FUNCTION period_counters_insert_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s smallint := coalesce(nullif(current_setting('overage.slot', true), '')::smallint, 0);
BEGIN
    INSERT INTO period_counters AS c (tenant_id, period_start, meter, billing_status, slot, overage_tokens)
    SELECT d.tenant_id, d.period_start, d.meter, d.billing_status, s, sum(d.o)::bigint
    FROM (
        SELECT g.tenant_id, g.period_start, coalesce(m.key, mt.key) AS meter, g.billing_status, m.o
        FROM (
            SELECT n.tenant_id, n.period_start, n.billing_status, n.meter_ids,
                sum(n.overage_input_tokens) AS i, sum(n.overage_output_tokens) AS o,
                sum(n.meter_lines[array_lower(n.meter_lines, 1) + 1]) AS o1,
                sum(n.meter_lines[array_lower(n.meter_lines, 1) + 3]) AS o2,
                sum(n.meter_lines[array_lower(n.meter_lines, 1) + 5]) AS o3,
                sum(n.meter_lines[array_lower(n.meter_lines, 1) + 7]) AS o4,
                sum(n.meter_lines[array_lower(n.meter_lines, 1) + 9]) AS o5
            FROM new_usage_logs n
            GROUP BY 1, 2, 3, 4
        ) AS g CROSS JOIN LATERAL (VALUES ('input'::text, NULL::smallint, g.i), ('output', NULL, g.o),
            (NULL, g.meter_ids[array_lower(g.meter_ids, 1)], g.o1), (NULL, g.meter_ids[array_lower(g.meter_ids, 1) + 1], g.o2),
            (NULL, g.meter_ids[array_lower(g.meter_ids, 1) + 2], g.o3), (NULL, g.meter_ids[array_lower(g.meter_ids, 1) + 3], g.o4),
            (NULL, g.meter_ids[array_lower(g.meter_ids, 1) + 4], g.o5)) AS m (key, id, o)
        LEFT JOIN meters mt ON mt.id = m.id
        WHERE m.key IS NOT NULL OR m.id IS NOT NULL
    ) AS d
    GROUP BY d.tenant_id, d.period_start, d.meter, d.billing_status
    HAVING sum(d.o) <> 0
    ORDER BY d.tenant_id, d.period_start, d.meter COLLATE "C", d.billing_status COLLATE "C"
    ON CONFLICT (tenant_id, period_start, meter, billing_status, slot) DO UPDATE SET
        overage_tokens = c.overage_tokens + EXCLUDED.overage_tokens;
    RETURN NULL;
END
$$;
