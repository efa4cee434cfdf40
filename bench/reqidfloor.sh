#!/usr/bin/env bash
# The cost of reading every kept partition in the lookups by request_id
# (issue 18): a database with a year of monthly partitions (13 past and
# current months, FLOOR_LOGS (50,000) billed logs under request_ids in each
# past one, VACUUM ANALYZE), then single events (32 clients, one tenant),
# the same each under a new request_id (ingestload -request-ids: an event
# without one never runs the lookup by request_id) and batches of 100 (8
# clients, 100 tenants, every event under a request_id) for FLOOR_SECONDS
# (20) each
# through `overage serve` built two ways, A B B A on the same database:
#   A  bin/overage-floor: the lookups read only the partitions from the
#      month of 36 days ago (ReplayFloorSQL, as before), built by
#      FLOOR_BIN (given, or left from a run) — see docs/benchmarks.md;
#   B  bin/overage: this tree, every kept partition.
set -euo pipefail
cd "$(dirname "$0")/.."
FLOOR_SECONDS=${FLOOR_SECONDS:-20}
FLOOR_LOGS=${FLOOR_LOGS:-50000}
FLOOR_BIN=${FLOOR_BIN:-bin/overage-floor}
BENCH_DB=${BENCH_DB:-overage_floor}
ADDR=${BENCH_ADDR:-127.0.0.1:18094}
. bench/lib.sh
URL=$(db_url "$BENCH_DB")
go build -o bin/ingestload ./bench/ingestload
go build -o bin/overage ./cmd/overage
SERVE=
stop() { if [ -n "$SERVE" ]; then kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null || true; SERVE=; fi; }
trap 'stop; psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)"' EXIT
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)" -c "CREATE DATABASE $BENCH_DB"
./bin/overage migrate --database-url "$URL" >/dev/null 2>&1
psql -q "$URL" -f bench/setup.sql
psql -q "$URL" <<SQL
DO \$\$
DECLARE m timestamptz; lo uuid; hi uuid; n text; p text;
BEGIN
  -- Every partition migrate made (the first one, the months ahead) gives
  -- way to the year's.
  FOR p IN SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent IN ('usage_reports'::regclass, 'usage_logs'::regclass)
      ORDER BY inhparent = 'usage_logs'::regclass LOOP
    EXECUTE format('DROP TABLE %s', p);
  END LOOP;
  DELETE FROM usage_log_partition_bounds;
  FOR i IN -12..3 LOOP
    m := date_trunc('month', now(), 'UTC') + make_interval(months => i);
    lo := (lpad(to_hex(floor(extract(epoch FROM m) * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid;
    hi := (lpad(to_hex(floor(extract(epoch FROM m + interval '1 month') * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid;
    n := to_char(m AT TIME ZONE 'UTC', 'YYYYMM');
    EXECUTE format('CREATE TABLE usage_logs_p%s (LIKE usage_logs INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION)', n);
    EXECUTE format('CREATE UNIQUE INDEX usage_logs_p%1\$s_request_key ON usage_logs_p%1\$s ((md5(tenant_id::text || request_id)::uuid)) WHERE request_id IS NOT NULL', n);
    EXECUTE format('ALTER TABLE usage_logs ATTACH PARTITION usage_logs_p%s FOR VALUES FROM (%L) TO (%L)', n, lo, hi);
    EXECUTE format('CREATE TABLE usage_reports_p%s (LIKE usage_reports INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION)', n);
    EXECUTE format('ALTER TABLE usage_reports ATTACH PARTITION usage_reports_p%s FOR VALUES FROM (%L) TO (%L)', n, lo, hi);
    INSERT INTO usage_log_partition_bounds (lower) VALUES (CASE WHEN i = -12 THEN '-infinity' ELSE m END);
    IF i < 0 THEN
      INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
          period_start, overage_input_tokens, overage_output_tokens, billing_status, billed_at)
        SELECT (lpad(to_hex(floor(extract(epoch FROM m + interval '1 day') * 1000)::bigint + g), 12, '0') || '7000' || '8' || lpad(to_hex(g), 15, '0'))::uuid,
          ('00000000-0000-0000-0000-' || lpad((g % 100 + 1)::text, 12, '0'))::uuid, 'seed-' || n || '-' || g,
          m + interval '1 day', 'u', 'm', 100, 50, date_trunc('month', m + interval '1 day', 'UTC'), 0, 0, 'billed', m + interval '2 days'
        FROM generate_series(1, $FLOOR_LOGS) g;
    END IF;
  END LOOP;
END
\$\$;
VACUUM ANALYZE usage_logs;
SQL
psql -qtA "$URL" -c "SELECT count(*) || ' partitions, ' || (SELECT count(*) FROM usage_logs) || ' logs' FROM pg_inherits WHERE inhparent = 'usage_logs'::regclass"
run() { # run BIN NAME
  LOG_LEVEL=warn DATABASE_URL="$URL" LISTEN_ADDR=$ADDR $1 serve 2>/tmp/$BENCH_DB.serve.log &
  SERVE=$!
  for _ in $(seq 1 100); do curl -fs "http://$ADDR/readyz" >/dev/null && break; sleep 0.1; done
  local l0; l0=$(cut -d' ' -f1 /proc/loadavg)
  LOG_LEVEL=error ./bin/ingestload -url "http://$ADDR" -duration "${FLOOR_SECONDS}s" -clients 32 -tenants 1 2>/dev/null > /tmp/$BENCH_DB.s.json || true
  LOG_LEVEL=error ./bin/ingestload -url "http://$ADDR" -duration "${FLOOR_SECONDS}s" -clients 32 -tenants 1 -request-ids 2>/dev/null > /tmp/$BENCH_DB.r.json || true
  ./bin/ingestload -url "http://$ADDR" -duration "${FLOOR_SECONDS}s" -clients 8 -tenants 100 -batch 100 2>/dev/null > /tmp/$BENCH_DB.b.json || true
  stop
  python3 - "$2" "$l0" "$(cut -d' ' -f1 /proc/loadavg)" /tmp/$BENCH_DB.s.json /tmp/$BENCH_DB.r.json /tmp/$BENCH_DB.b.json <<'PY'
import json, sys
name, l0, l1, s, r, b = sys.argv[1:]
s, r, b = json.load(open(s)), json.load(open(r)), json.load(open(b))
print(f"{name}: singles {s['events_per_s']:.0f} events/s p99 {s.get('p99_ms', 0):.1f} ms; singles with request_ids {r['events_per_s']:.0f} events/s p99 {r.get('p99_ms', 0):.1f} ms; batches {b['events_per_s']:.0f} events/s p99 {b.get('p99_ms', 0):.1f} ms; load {l0} -> {l1}")
PY
}
run "$FLOOR_BIN" "A floor" ; run ./bin/overage "B every partition"; run ./bin/overage "B every partition"; run "$FLOOR_BIN" "A floor"
