#!/usr/bin/env bash
# Expiry keeps up (issue 18): 10,000 events/s offered end to end (batches
# of 100 of 100 tenants to one `overage serve`, one `overage work` billing
# to the Stripe emulator, as bench/e2e) for EXPIRY_SECONDS (600) on a fresh
# database with no manual VACUUM or ANALYZE, while the idempotency
# records' partitions fill, expire and are dropped by `work`'s own
# maintenance. Time is compressed: the development build with
# OVERAGE_DEV_IDEMPOTENCY_WIDTH=EXPIRY_WIDTH (1m) keeps records a minute
# in minute-wide partitions, drops one 5 s after its last record expired
# and maintains every second — production's day, hour and ten minutes,
# scaled (docs/benchmarks.md says what that changes). bench/expiry prints
# the expired backlog every EXPIRY_SAMPLE (5s), events/s ingested and
# billed per 30 s, maintenance's share of the machine, a PASS or FAIL per
# goal, and exits 1 on a FAIL.
set -euo pipefail
cd "$(dirname "$0")/.."
EXPIRY_SECONDS=${EXPIRY_SECONDS:-600}
export OVERAGE_DEV_IDEMPOTENCY_WIDTH=${EXPIRY_WIDTH:-1m}
BENCH_DB=${BENCH_DB:-overage_expiry}
. bench/lib.sh
URL=$(db_url "$BENCH_DB")
# Always built: a binary left in bin/ by an older checkout would be measured instead.
go build -tags dev -o bin/overage-dev ./cmd/overage
go build -tags dev -o bin/expiry ./bench/expiry
drop() { psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)"; }
trap drop EXIT
drop
psql -q "$PGHOST_URL" -c "CREATE DATABASE $BENCH_DB"
./bin/overage-dev migrate --database-url "$URL" >/dev/null 2>&1
# A fresh database's first partition spans everything to three UTC days
# ahead (migration 0025), so the minutes would all land in it. It is empty:
# drop it, as its expiry would, and let migrate make the minutes.
legacy=$(psql -qtA "$URL" -c "SELECT count(*) FROM idempotency_keys_legacy")
[ "$legacy" = 0 ] || { echo "idempotency_keys_legacy holds $legacy records: not a fresh database" >&2; exit 1; }
psql -q "$URL" -c "DROP TABLE idempotency_keys_legacy"
./bin/overage-dev migrate --database-url "$URL" >/dev/null 2>&1
psql -q "$URL" -f bench/setup.sql
echo "load before: $(uptime)"
rc=0
./bin/expiry -database-url "$URL" -bin ./bin/overage-dev -addr "${EXPIRY_ADDR:-127.0.0.1:18083}" \
  -duration "${EXPIRY_SECONDS}s" -rate "${EXPIRY_RATE:-10000}" -batch "${EXPIRY_BATCH:-100}" -sample "${EXPIRY_SAMPLE:-5s}" || rc=$?
echo "load after: $(uptime)"
exit $rc
