-- Counts the usage logs written before 0041's triggers existed, without
-- blocking any write. The triggers count every change committed since
-- 0041; this statement reads, in ONE snapshot, every log as it stands (L)
-- and the counter rows the triggers have written (C), and adds L - C in
-- slot -1. The counters then hold C + (L - C) = L as of that snapshot, and
-- every change committed after it is added by its trigger: exact, whatever
-- ran meanwhile. A change in flight during the scan is not in the
-- snapshot, neither in L nor in C, and its trigger adds it at its commit.
--
-- Cost: one sequential scan of usage_logs and a GROUP BY (seconds per ten
-- million logs), reading only; ingest and the workers go on. Run once:
-- the migration table records it.
INSERT INTO period_counters (tenant_id, period_start, meter, billing_status, slot, overage_tokens)
SELECT d.tenant_id, d.period_start, d.meter, d.billing_status, -1, sum(d.o)::bigint
FROM (
    SELECT u.tenant_id, u.period_start, m.meter, u.billing_status, sum(m.o) AS o
    FROM usage_logs u CROSS JOIN LATERAL (
        SELECT 'input'::text AS meter, u.overage_input_tokens AS o
        UNION ALL SELECT 'output', u.overage_output_tokens
        UNION ALL SELECT x.k, x.o FROM unnest(u.meter_keys, u.meter_overage) AS x (k, o)
    ) AS m
    GROUP BY 1, 2, 3, 4
    UNION ALL
    SELECT tenant_id, period_start, meter, billing_status, -sum(overage_tokens)
    FROM period_counters
    GROUP BY 1, 2, 3, 4
) AS d
GROUP BY d.tenant_id, d.period_start, d.meter, d.billing_status
HAVING sum(d.o) <> 0;
