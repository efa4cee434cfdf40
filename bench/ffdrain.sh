#!/usr/bin/env bash
# Billing throughput by the usage log partitions' fillfactor (issue 18): for
# each of FF_VARIANTS ("80 100 100 80", A B B A), a fresh database whose
# (empty) partitions get that fillfactor, then bench/drain seeds
# DRAIN_LOGS (100,000) pending logs and times one `overage work` billing
# them into the Stripe emulator (5 ms a call). Prints logs/s beside the
# load average.
set -euo pipefail
cd "$(dirname "$0")/.."
FF_VARIANTS=${FF_VARIANTS:-80 100 100 80}
DRAIN_LOGS=${DRAIN_LOGS:-100000}
BENCH_DB=${BENCH_DB:-overage_ffdrain}
. bench/lib.sh
URL=$(db_url "$BENCH_DB")
go build -o bin/overage ./cmd/overage
go build -o bin/drain ./bench/drain
trap 'psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)"' EXIT
for ff in $FF_VARIANTS; do
  psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)" -c "CREATE DATABASE $BENCH_DB"
  ./bin/overage migrate --database-url "$URL" >/dev/null 2>&1
  psql -q "$URL" -c "DO \$\$ DECLARE p text; BEGIN FOR p IN SELECT relid::regclass::text FROM pg_partition_tree('usage_logs') WHERE isleaf LOOP EXECUTE format('ALTER TABLE %s SET (fillfactor = $ff)', p); END LOOP; END \$\$"
  l0=$(cut -d' ' -f1 /proc/loadavg)
  ./bin/drain -database-url "$URL" -bin ./bin/overage -logs "$DRAIN_LOGS" 2>/dev/null | python3 -c "import json,sys; r=json.load(sys.stdin); print('fillfactor $ff:', r['billed'], 'billed,', round(r['logs_per_s']), 'logs/s,', round(r['seconds'],1), 's, load $l0 ->', open('/proc/loadavg').read().split()[0])"
  psql -qtA "$URL" -c "SELECT 'hot ' || sum(n_tup_hot_upd) || ' of ' || sum(n_tup_upd) || ' updates; ' || round(sum(pg_total_relation_size(relid)) / (SELECT count(*) FROM usage_logs)) || ' B/log billed' FROM pg_stat_user_tables WHERE relname LIKE 'usage_logs_%'"
done
