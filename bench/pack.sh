#!/usr/bin/env bash
# A month's usage logs packed (issue 18; usagelog.PackPartition, what
# retention does to a month's partition once it is over and billed), in
# bytes a log, on fresh databases with no manual VACUUM or ANALYZE before
# the load: the soak's batched load (8 clients, batches of 100 events of
# 100 tenants) for PACK_SECONDS (60) into `overage serve`, then
#   as ingested: the logs pending, packed (bench/pack);
#   billed:      on a second database the same load, billed by one
#                `overage work` into the Stripe emulator (bench/drain
#                -no-seed), a VACUUM of usage_logs (what autovacuum does
#                in the day before retention packs), then packed;
#   as deployed: only when the server runs autovacuum (as production
#                must; `autovacuum = off` skips it), a third database
#                written and billed at once (bench/e2e: PACK_RATE (3,000)
#                events/s offered for PACK_E2E_SECONDS (300), serve and
#                work together), autovacuum freeing the dead versions
#                while the month is written, then packed.
set -euo pipefail
cd "$(dirname "$0")/.."
PACK_SECONDS=${PACK_SECONDS:-60}
PACK_RATE=${PACK_RATE:-3000}
PACK_E2E_SECONDS=${PACK_E2E_SECONDS:-300}
BENCH_DB=${BENCH_DB:-overage_pack}
ADDR=${BENCH_ADDR:-127.0.0.1:18083}
. bench/lib.sh
URL=$(db_url "$BENCH_DB")
go build -o bin/overage ./cmd/overage
go build -o bin/ingestload ./bench/ingestload
go build -o bin/drain ./bench/drain
go build -o bin/pack ./bench/pack
go build -o bin/e2e ./bench/e2e
SERVE=
stop() { if [ -n "$SERVE" ]; then kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null || true; SERVE=; fi; }
trap 'stop; psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)"' EXIT
# fresh: a fresh, migrated database with the bench tenants.
fresh() {
  psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)" -c "CREATE DATABASE $BENCH_DB"
  ./bin/overage migrate --database-url "$URL" >/dev/null 2>&1
  psql -q "$URL" -f bench/setup.sql
}
# loaded: a fresh database with the batched load's logs in it.
loaded() {
  fresh
  LOG_LEVEL=warn DATABASE_URL="$URL" LISTEN_ADDR=$ADDR ./bin/overage serve &
  SERVE=$!
  for _ in $(seq 1 100); do curl -fs "http://$ADDR/readyz" >/dev/null && break; sleep 0.1; done
  ./bin/ingestload -url "http://$ADDR" -duration "${PACK_SECONDS}s" -window 30s -clients 8 -tenants 100 -batch 100 2>/dev/null |
    python3 -c "import json,sys; r=json.load(sys.stdin); print('load:', round(r['events_per_s']), 'events/s,', r['errors'], 'errors')"
  stop
}
echo "== as ingested"
loaded
./bin/pack -database-url "$URL"
echo "== billed"
loaded
./bin/drain -database-url "$URL" -bin ./bin/overage -no-seed 2>/dev/null |
  python3 -c "import json,sys; r=json.load(sys.stdin); print('billed:', r['billed'], 'logs,', round(r['logs_per_s']), 'logs/s')"
psql -qtA "$URL" -c "SELECT 'updates ' || sum(n_tup_upd) || ', HOT ' || sum(n_tup_hot_upd) FROM pg_stat_user_tables WHERE relname LIKE 'usage_logs_%'"
psql -q "$URL" -c "VACUUM usage_logs"
./bin/pack -database-url "$URL"
echo "== as deployed: written and billed at once"
if [ "$(psql -qtA "$PGHOST_URL" -c "SHOW autovacuum")" != on ]; then
  echo "skipped: the server runs with autovacuum = off"
  exit 0
fi
fresh
./bin/e2e -database-url "$URL" -bin ./bin/overage -addr "$ADDR" -rate "$PACK_RATE" -duration "${PACK_E2E_SECONDS}s" 2>/dev/null |
  python3 -c "import json,sys; r=json.load(sys.stdin); print('e2e:', json.dumps(r))"
psql -qtA "$URL" -c "SELECT 'updates ' || sum(n_tup_upd) || ', HOT ' || sum(n_tup_hot_upd) || ', autovacuums ' || sum(autovacuum_count) FROM pg_stat_user_tables WHERE relname LIKE 'usage_logs_%'"
./bin/pack -database-url "$URL"
