#!/usr/bin/env bash
# One soak of single events of one tenant (32 clients, `overage serve`
# only, a fresh database, no VACUUM or ANALYZE), with what changes over
# it sampled beside the 30 s windows (issue 18's drop after the first
# minute):
#   $OUT.waits   every second: the database's backends by state and wait
#                event (pg_stat_activity);
#   $OUT.stats   every 10 s: WAL bytes, checkpoints, and per table the rows
#                inserted/updated/HOT-updated/dead, last autovacuum and
#                autoanalyze, and its size with its indexes;
#   $OUT.cpu     every 10 s: CPU seconds of serve and of the database's
#                backends (/proc);
#   $OUT.json    ingestload's windows.
# PROBE_EXPLAIN=1 also loads auto_explain in the database (per database,
# no server change): a sample of the plans with their buffers into the
# server's log.
set -euo pipefail
cd "$(dirname "$0")/.."
DB=${DB:-overage_soak2_a}
ADDR=${ADDR:-127.0.0.1:18791}
SECS=${SECS:-150}
OUT=${OUT:-/tmp/$DB}
. bench/lib.sh
URL=$(db_url "$DB")
go build -o bin/ingestload ./bench/ingestload
go build -o bin/overage ./cmd/overage

psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
./bin/overage migrate --database-url "$URL" >/dev/null 2>&1
psql -q "$URL" -f bench/setup.sql
if [ -n "${PROBE_EXPLAIN:-}" ]; then
  psql -q "$URL" -c "ALTER DATABASE $DB SET session_preload_libraries = 'auto_explain'" \
    -c "ALTER DATABASE $DB SET auto_explain.log_min_duration = 0" \
    -c "ALTER DATABASE $DB SET auto_explain.sample_rate = ${PROBE_SAMPLE:-0.01}" \
    -c "ALTER DATABASE $DB SET auto_explain.log_analyze = on" \
    -c "ALTER DATABASE $DB SET auto_explain.log_timing = off" \
    -c "ALTER DATABASE $DB SET auto_explain.log_buffers = on" \
    -c "ALTER DATABASE $DB SET auto_explain.log_nested_statements = on"
fi
[ -n "${PROBE_SETUP:-}" ] && psql -q "$URL" -c "$PROBE_SETUP"

LOG_LEVEL=warn DATABASE_URL="$URL" LISTEN_ADDR=$ADDR ./bin/overage serve &
SERVE=$!
PIDS=()
trap 'kill ${PIDS[@]+"${PIDS[@]}"} $SERVE 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -fs "http://$ADDR/readyz" >/dev/null && break; sleep 0.1; done

T0=$(date +%s)
(while :; do
  psql -qtA "$URL" -F ' ' -c "SELECT extract(epoch FROM now())::int - $T0, state, coalesce(wait_event_type, '-'), coalesce(wait_event, '-'), count(*)
    FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle' GROUP BY 2, 3, 4 ORDER BY 5 DESC"
  sleep 1
done) > "$OUT.waits" 2>/dev/null &
PIDS+=($!)
(while :; do
  psql -qtA "$URL" -F ' ' <<SQL
SELECT 't', extract(epoch FROM now())::int - $T0, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,
  (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter), (SELECT count(*) FROM usage_logs),
  (SELECT wal_fpi FROM pg_stat_wal);
SELECT 'r', extract(epoch FROM now())::int - $T0, relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_dead_tup,
  coalesce(to_char(last_autovacuum, 'HH24:MI:SS'), '-'), coalesce(to_char(last_autoanalyze, 'HH24:MI:SS'), '-'), pg_total_relation_size(relid)
  FROM pg_stat_user_tables WHERE n_tup_ins + n_tup_upd > 0 ORDER BY relname;
SQL
  sleep 10
done) > "$OUT.stats" 2>/dev/null &
PIDS+=($!)
# PROBE_WALINSPECT=1: every 10 s, the full-page images of the WAL written
# since the last sample, counted per relation of this database
# (pg_walinspect, superuser); $OUT.fpi.
if [ -n "${PROBE_WALINSPECT:-}" ]; then
  psql -q "$URL" -c "CREATE EXTENSION IF NOT EXISTS pg_walinspect"
  (lsn=$(psql -qtA "$URL" -c "SELECT pg_current_wal_lsn()")
  while :; do
    sleep 10
    now=$(psql -qtA "$URL" -c "SELECT pg_current_wal_lsn()")
    psql -qtA "$URL" -F ' ' -c "SELECT extract(epoch FROM clock_timestamp())::int - $T0, coalesce(c.relname, m[2]), count(*), sum(8192 - m[3]::int)
      FROM pg_get_wal_records_info('$lsn', '$now') w,
        regexp_matches(w.block_ref, 'rel [0-9]+/([0-9]+)/([0-9]+) fork main blk [0-9]+ \\(FPW\\); hole: offset: [0-9]+, length: ([0-9]+)', 'g') m
      LEFT JOIN pg_class c ON c.relfilenode = m[2]::oid
      WHERE m[1]::oid = (SELECT oid FROM pg_database WHERE datname = current_database())
      GROUP BY 2 ORDER BY 4 DESC LIMIT 8"
    lsn=$now
  done) > "$OUT.fpi" 2>&1 &
  PIDS+=($!)
fi
(while :; do
  now=$(( $(date +%s) - T0 ))
  s=$(awk '{print ($14+$15)/100}' /proc/$SERVE/stat)
  b=0
  for p in $(psql -qtA "$URL" -c "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"); do
    c=$(awk '{print ($14+$15)/100}' /proc/$p/stat 2>/dev/null || echo 0)
    b=$(python3 -c "print($b + $c)")
  done
  echo "$now serve $s backends $b load $(cut -d' ' -f1 /proc/loadavg)"
  sleep 10
done) > "$OUT.cpu" 2>/dev/null &
PIDS+=($!)

./bin/ingestload -url "http://$ADDR" -duration "${SECS}s" -window 30s -clients 32 -tenants 1 2>/dev/null > "$OUT.json" || true
python3 - "$OUT.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
w = r["windows"]
print(f"events/s {r['events_per_s']:.0f} p99 {r['p99_ms']:.1f} errors {r['errors']} last/first {w[-1]['events_per_s'] / max(w[0]['events_per_s'], 1):.2f}")
print("  per window (events/s/p99 ms): " + ", ".join(f"{x['events_per_s']:.0f}/{x['p99_ms']:.0f}" for x in w))
PY
python3 - "$OUT.stats" <<'PY'
import sys
prev = None
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 6 and f[0] == 't':
        s, wal, ck, n, fpi = map(int, f[1:])
        if prev and n > prev[3]:
            de = n - prev[3]
            print(f"t={s:4d} events {de / max(s - prev[0], 1):6.0f}/s  WAL/event {(wal - prev[1]) / de:6.0f} B  FPI/event {(fpi - prev[4]) / de:5.2f}  checkpoints +{ck - prev[2]}")
        prev = (s, wal, ck, n, fpi)
PY
grep '^r ' "$OUT.stats" | awk -v t="$(grep '^r ' "$OUT.stats" | tail -1 | cut -d' ' -f2)" '$2 == t {print "  " $3, "ins", $4, "upd", $5, "hot", $6, "dead", $7, "autovacuum", $8, "autoanalyze", $9, "bytes", $10}'
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
