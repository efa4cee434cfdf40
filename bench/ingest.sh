#!/usr/bin/env bash
# Ingest benchmark: POST /v1/usage-events over real HTTP at 8 and 32
# clients, and in the same run the same SQL transaction through pgbench;
# prints events/s, p50, p99 and the ratio to pgbench.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-15}
PGHOST_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
BENCH_DB=overage_bench
BENCH_URL=$(python3 -c "import sys,urllib.parse as u; p=u.urlparse(sys.argv[1]); print(p._replace(path='/$BENCH_DB').geturl())" "$PGHOST_URL")
ADDR=127.0.0.1:18080

psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)" -c "CREATE DATABASE $BENCH_DB"
./bin/overage migrate --database-url "$BENCH_URL" >/dev/null
psql -q "$BENCH_URL" -f bench/setup.sql
go build -o bin/ingestload ./bench/ingestload

LOG_LEVEL=warn DATABASE_URL="$BENCH_URL" LISTEN_ADDR=$ADDR ./bin/overage serve &
SERVE=$!
trap 'kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -fs "http://$ADDR/readyz" >/dev/null && break; sleep 0.1; done

printf '%-8s %-10s %12s %9s %9s %14s %8s\n' clients driver events/s p50_ms p99_ms pgbench_tps ratio
for c in 8 32; do
  http=$(./bin/ingestload -url "http://$ADDR" -clients $c -duration ${DURATION}s)
  pgb=$(pgbench -n -c $c -j 2 -T $DURATION -f bench/ingest.pgbench "$BENCH_URL" 2>&1)
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$pgb" | tail -1)
  pglat=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' <<<"$pgb")
  python3 - "$http" "$tps" "$pglat" "$c" <<'PY'
import json, sys
h = json.loads(sys.argv[1]); tps = float(sys.argv[2]); pglat = sys.argv[3]; c = sys.argv[4]
print(f"{c:<8} {'http':<10} {h['events_per_s']:12.0f} {h['p50_ms']:9.2f} {h['p99_ms']:9.2f} {tps:14.0f} {h['events_per_s']/tps:8.2f}")
print(f"{c:<8} {'pgbench':<10} {tps:12.0f} {'avg '+pglat:>19}")
PY
done

# Drain: 200,000 pending logs of 100 tenants, one `overage work` process,
# the emulator with 5 ms latency, Stripe's 1,000 calls/s per account and one
# call per customer and meter; then the same 200,000 logs of one customer.
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS ${BENCH_DB}_drain WITH (FORCE)" -c "CREATE DATABASE ${BENCH_DB}_drain"
DRAIN_URL=$(python3 -c "import sys,urllib.parse as u; p=u.urlparse(sys.argv[1]); print(p._replace(path='/${BENCH_DB}_drain').geturl())" "$PGHOST_URL")
./bin/overage migrate --database-url "$DRAIN_URL" >/dev/null
go run ./bench/drain -database-url "$DRAIN_URL" -logs "${DRAIN_LOGS:-200000}" -tenants 100
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS ${BENCH_DB}_drain WITH (FORCE)" -c "CREATE DATABASE ${BENCH_DB}_drain"
./bin/overage migrate --database-url "$DRAIN_URL" >/dev/null
go run ./bench/drain -database-url "$DRAIN_URL" -logs "${DRAIN_LOGS:-200000}" -tenants 1
# The same with 10 of the 200 customers hanging: everyone else must still
# be billed at about the rate above.
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS ${BENCH_DB}_drain WITH (FORCE)" -c "CREATE DATABASE ${BENCH_DB}_drain"
./bin/overage migrate --database-url "$DRAIN_URL" >/dev/null
go run ./bench/drain -database-url "$DRAIN_URL" -logs 20000 -tenants 200 -hang 10

# Status: GET /v1/billing/status over real HTTP on 10 million usage logs
# across 1,000 tenants, seeded with COPY (STATUS_LOGS shrinks it).
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS ${BENCH_DB}_status WITH (FORCE)"
STATUS_URL=$(python3 -c "import sys,urllib.parse as u; p=u.urlparse(sys.argv[1]); print(p._replace(path='/${BENCH_DB}_status').geturl())" "$PGHOST_URL")
go run ./bench/status -database-url "$STATUS_URL" -create -logs "${STATUS_LOGS:-10000000}"
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS ${BENCH_DB}_status WITH (FORCE)"
