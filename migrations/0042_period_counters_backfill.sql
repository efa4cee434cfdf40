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
INSERT INTO period_counters (tenant_id, period_start, billing_status, slot, usage_logs, overage_input_tokens, overage_output_tokens)
SELECT d.tenant_id, d.period_start, d.billing_status, -1, sum(d.n)::bigint, sum(d.i)::bigint, sum(d.o)::bigint
FROM (
    SELECT tenant_id, period_start, billing_status, count(*) AS n,
           sum(overage_input_tokens) AS i, sum(overage_output_tokens) AS o
    FROM usage_logs
    GROUP BY tenant_id, period_start, billing_status
    UNION ALL
    SELECT tenant_id, period_start, billing_status, -sum(usage_logs), -sum(overage_input_tokens), -sum(overage_output_tokens)
    FROM period_counters
    GROUP BY tenant_id, period_start, billing_status
) AS d
GROUP BY d.tenant_id, d.period_start, d.billing_status
HAVING sum(d.n) <> 0 OR sum(d.i) <> 0 OR sum(d.o) <> 0;
