#!/usr/bin/env bash
# Storage of a batched usage log through its life, by the unique index on
# request_id and the partitions' fillfactor (issue 18): each variant on a
# fresh database, its (empty) partitions given the index and fillfactor,
# then batches of 100 events of 100 tenants from 8 clients for
# LIFE_SECONDS (30) through `overage serve`, then `overage work` bills them
# into the Stripe emulator (bench/drain -no-seed: 5 ms a call, Stripe's
# 1,000 calls/s), then VACUUM, then the same load again. Bytes a log (heap + TOAST + indexes, every
# partition, bench/soak.sh's measure) after each step, the drain's logs/s.
# Variants (LIFE_VARIANTS, default "digest100 tdigest100 tdigest100
# digest100", A B B A): key = (tenant_id, request_id) as before 0061,
# digest = (tenant_id, md5(request_id)::uuid) as from 0061, tdigest =
# md5(tenant_id::text || request_id)::uuid alone as since 0067; the number
# is the fillfactor.
set -euo pipefail
cd "$(dirname "$0")/.."
LIFE_SECONDS=${LIFE_SECONDS:-30}
LIFE_VARIANTS=${LIFE_VARIANTS:-digest100 tdigest100 tdigest100 digest100}
BENCH_DB=${BENCH_DB:-overage_life}
ADDR=${BENCH_ADDR:-127.0.0.1:18093}
. bench/lib.sh
URL=$(db_url "$BENCH_DB")
go build -o bin/ingestload ./bench/ingestload
go build -o bin/overage ./cmd/overage
go build -o bin/drain ./bench/drain
SERVE=
stop() { if [ -n "$SERVE" ]; then kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null || true; SERVE=; fi; }
trap 'stop; psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)"' EXIT
size() {
  psql -qtA "$URL" <<SQL
WITH p AS (SELECT relid FROM pg_partition_tree('usage_logs') WHERE isleaf), n AS (SELECT greatest(count(*), 1)::numeric AS n FROM usage_logs)
SELECT '$1 ' || round(sum(pg_total_relation_size(relid)) / n) || ' B/log (heap ' || round(sum(pg_table_size(relid)) / n)
    || ', indexes ' || round(sum(pg_indexes_size(relid)) / n) || ': '
    || (SELECT string_agg(regexp_replace(i.indexrelid::regclass::text, '^usage_logs_(p[0-9]+|legacy)', '') || ' ' || round(pg_relation_size(i.indexrelid) / n, 1), ', ' ORDER BY 1)
        FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE i.indrelid IN (SELECT relid FROM p) AND pg_relation_size(i.indexrelid) > 8192)
    || '; ' || n || ' logs)'
  FROM p, n GROUP BY n.n;
SQL
}
for v in $LIFE_VARIANTS; do
  kind=${v%%[0-9]*}; ff=${v#$kind}
  psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)" -c "CREATE DATABASE $BENCH_DB"
  ./bin/overage migrate --database-url "$URL" >/dev/null 2>&1
  psql -q "$URL" -f bench/setup.sql
  psql -q "$URL" <<SQL
DO \$\$
DECLARE p text;
BEGIN
  FOR p IN SELECT relid::regclass::text FROM pg_partition_tree('usage_logs') WHERE isleaf LOOP
    EXECUTE format('ALTER TABLE %s SET (fillfactor = $ff)', p);
    IF '$kind' <> 'tdigest' THEN
      EXECUTE format('DROP INDEX IF EXISTS %I', p || '_request_key');
    END IF;
    IF '$kind' = 'key' THEN
      EXECUTE format('CREATE UNIQUE INDEX IF NOT EXISTS %I ON %s (tenant_id, request_id) WHERE request_id IS NOT NULL', p || '_request_id', p);
    ELSIF '$kind' = 'digest' THEN
      EXECUTE format('CREATE UNIQUE INDEX IF NOT EXISTS %I ON %s (tenant_id, (md5(request_id)::uuid)) WHERE request_id IS NOT NULL', p || '_request_digest', p);
    END IF;
  END LOOP;
END
\$\$;
SQL
  LOG_LEVEL=warn DATABASE_URL="$URL" LISTEN_ADDR=$ADDR ./bin/overage serve &
  SERVE=$!
  for _ in $(seq 1 100); do curl -fs "http://$ADDR/readyz" >/dev/null && break; sleep 0.1; done
  ./bin/ingestload -url "http://$ADDR" -duration "${LIFE_SECONDS}s" -clients 8 -tenants 100 -batch 100 2>/dev/null > /tmp/$BENCH_DB.load.json || true
  stop
  echo "== $v (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  python3 -c "import json; r=json.load(open('/tmp/$BENCH_DB.load.json')); print('ingest', round(r.get('events_per_s', 0)), 'events/s')" || true
  size "ingested"
  ./bin/drain -database-url "$URL" -bin ./bin/overage -no-seed | python3 -c "import json,sys; r=json.load(sys.stdin); print('billing', r['billed'], 'billed,', round(r['logs_per_s']), 'logs/s,', round(r['seconds'],1), 's')"
  size "billed"
  psql -q "$URL" -c "VACUUM usage_logs"
  size "vacuumed"
  # The same load again: what the vacuumed free space takes back.
  LOG_LEVEL=warn DATABASE_URL="$URL" LISTEN_ADDR=$ADDR ./bin/overage serve &
  SERVE=$!
  for _ in $(seq 1 100); do curl -fs "http://$ADDR/readyz" >/dev/null && break; sleep 0.1; done
  ./bin/ingestload -url "http://$ADDR" -duration "${LIFE_SECONDS}s" -clients 8 -tenants 100 -batch 100 2>/dev/null > /tmp/$BENCH_DB.load.json || true
  stop
  size "ingested again"
  psql -qtA "$URL" -c "SELECT 'hot ' || sum(n_tup_hot_upd) || ' of ' || sum(n_tup_upd) || ' updates' FROM pg_stat_user_tables WHERE relname LIKE 'usage_logs_%'"
done
echo "done (load average $(cut -d' ' -f1-3 /proc/loadavg))"
