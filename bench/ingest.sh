#!/usr/bin/env bash
# Ingest benchmark, each figure a ratio to a reference measured in the same
# run on the same server: the least PostgreSQL work for the same events
# (bench/reference.sql, bench/ref_single.pgbench, bench/ref_batch.pgbench)
# through pgbench.
#   single: POST /v1/usage-events over real HTTP, 32 clients, ONE tenant
#           (no allowance), vs ref_single.pgbench at 32 clients;
#   batch:  POST /v1/usage-events/batch, 1,000 events a request, 8 clients,
#           100 tenants, vs ref_batch.pgbench at 8 clients (x 1,000 events).
# Then end to end (bench/e2e), the drain and the status benchmarks.
# INGEST_ONLY=1 runs only the ingest figures, E2E_ONLY=1 only end to end.
# METERS=3 makes every event of the ingest and end-to-end figures feed
# three meters of a per-model catalog (bench/meters.lib.sh; `make
# bench-meters` compares that with the two default meters, A B B A).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/meters.lib.sh
METERS=${METERS:-2}
case $METERS in 2) EVENT_FLAGS="" ;; 3) EVENT_FLAGS=$(event_flags) ;; *) echo "METERS must be 2 (the defaults) or 3" >&2; exit 2 ;; esac
DURATION=${DURATION:-15}
BENCH_DB=${BENCH_DB:-overage_bench}  # a different name lets two checkouts bench side by side
. bench/lib.sh
BENCH_URL=$(db_url $BENCH_DB)
REF_URL=$(db_url ${BENCH_DB}_ref)
ADDR=${BENCH_ADDR:-127.0.0.1:18080}

ingest() {
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)" -c "CREATE DATABASE $BENCH_DB" \
  -c "DROP DATABASE IF EXISTS ${BENCH_DB}_ref WITH (FORCE)" -c "CREATE DATABASE ${BENCH_DB}_ref"
./bin/overage migrate --database-url "$BENCH_URL" >/dev/null 2>&1
psql -q "$BENCH_URL" -f bench/setup.sql
[ "$METERS" = 3 ] && create_meters "$BENCH_URL"
psql -q "$REF_URL" -f bench/reference.sql
go build -o bin/ingestload ./bench/ingestload

LOG_LEVEL=warn DATABASE_URL="$BENCH_URL" LISTEN_ADDR=$ADDR ./bin/overage serve &
SERVE=$!
trap 'kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -fs "http://$ADDR/readyz" >/dev/null && break; sleep 0.1; done

# run NAME CLIENTS EVENTS_PER_TX PGBENCH_SCRIPT INGESTLOAD_FLAGS...
# The machine is shared and its load drifts, so the two sides alternate
# A B B A, each half of DURATION twice: a linear drift cancels out of the
# ratio. Latencies are the mean of the two HTTP halves.
run() {
  local name=$1 c=$2 per=$3 script=$4; shift 4
  local half=$(( (DURATION + 1) / 2 )) h1 h2 p1 p2
  # ingestload exits 1 when a request was not answered 202; its JSON still
  # counts only the 202s, and the errors are printed below.
  # shellcheck disable=SC2086 # EVENT_FLAGS is several flags
  http_half() { ./bin/ingestload -url "http://$ADDR" -clients "$c" -duration "${half}s" $EVENT_FLAGS "$@" || true; }
  # A failing pgbench (say, too many clients on a shared server) is shown,
  # not swallowed by set -e.
  ref_half() {
    local out
    out=$(pgbench -n -c "$c" -j 2 -T "$half" -f "$script" "$REF_URL" 2>&1) || { echo "pgbench failed: $out" >&2; return 1; }
    sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | tail -1
  }
  # No warm-up and no VACUUM ANALYZE: the database is as a deployment has
  # it, fresh, its statistics whatever autovacuum made of them (the
  # ingest transaction's plans do not depend on them).
  h1=$(http_half "$@"); p1=$(ref_half); p2=$(ref_half); h2=$(http_half "$@")
  python3 - "$name" "$c" "$h1" "$h2" "$p1" "$p2" "$per" <<'PY'
import json, sys
name, c = sys.argv[1], sys.argv[2]
h1, h2 = json.loads(sys.argv[3]), json.loads(sys.argv[4])
tps = (float(sys.argv[5]) + float(sys.argv[6])) / 2
per = int(sys.argv[7])
ev = (h1['events_per_s'] + h2['events_per_s']) / 2
p50 = (h1['p50_ms'] + h2['p50_ms']) / 2
p99 = (h1['p99_ms'] + h2['p99_ms']) / 2
ref = tps * per
print(f"{name:<8} {c:>7} {ev:12.0f} {p50:9.2f} {p99:9.2f} {ref:14.0f} {ev/ref:7.2f}")
print(f"  {name} halves in run order: HTTP {h1['events_per_s']:.0f} (p99 {h1['p99_ms']:.1f} ms), "
      f"pgbench {float(sys.argv[5]) * per:.0f}, pgbench {float(sys.argv[6]) * per:.0f}, "
      f"HTTP {h2['events_per_s']:.0f} (p99 {h2['p99_ms']:.1f} ms) events/s")
for h in (h1, h2):
    if h['errors']:
        print(f"  ({name}: {h['errors']} requests not answered 202: {h['statuses']})")
PY
}
printf '%-8s %7s %12s %9s %9s %14s %7s\n' load clients events/s p50_ms p99_ms ref_events/s ratio
run single 32 1 bench/ref_single.pgbench -tenants 1
run batch 8 1000 bench/ref_batch.pgbench -tenants 100 -batch 1000
kill $SERVE; wait $SERVE 2>/dev/null || true
trap - EXIT
}
[ -z "${E2E_ONLY:-}" ] && ingest
[ -n "${INGEST_ONLY:-}" ] && exit 0

# End to end: 100 tenants offer E2E_RATE (10,000) events/s in batches of
# E2E_BATCH (100: each tenant a batch a second) for E2E_SECONDS (30) to one
# `overage serve`, one `overage work` reporting to the emulator (5 ms
# latency, 1,000 calls/s, one call at a time per customer and meter).
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS ${BENCH_DB}_e2e WITH (FORCE)" -c "CREATE DATABASE ${BENCH_DB}_e2e"
E2E_URL=$(db_url ${BENCH_DB}_e2e)
./bin/overage migrate --database-url "$E2E_URL" >/dev/null 2>&1
psql -q "$E2E_URL" -f bench/setup.sql
[ "$METERS" = 3 ] && create_meters "$E2E_URL"
# shellcheck disable=SC2086
go run ./bench/e2e -database-url "$E2E_URL" -addr "${E2E_ADDR:-127.0.0.1:18081}" -rate "${E2E_RATE:-10000}" -batch "${E2E_BATCH:-100}" -duration "${E2E_SECONDS:-30}s" $EVENT_FLAGS
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS ${BENCH_DB}_e2e WITH (FORCE)"
[ -n "${E2E_ONLY:-}" ] && exit 0

# Drain: 200,000 pending logs of 100 tenants, one `overage work` process,
# the emulator with 5 ms latency, Stripe's 1,000 calls/s per account and one
# call per customer and meter; then the same 200,000 logs of one customer.
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS ${BENCH_DB}_drain WITH (FORCE)" -c "CREATE DATABASE ${BENCH_DB}_drain"
DRAIN_URL=$(db_url ${BENCH_DB}_drain)
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
STATUS_URL=$(db_url ${BENCH_DB}_status)
go run ./bench/status -database-url "$STATUS_URL" -create -logs "${STATUS_LOGS:-10000000}"
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS ${BENCH_DB}_status WITH (FORCE)"
