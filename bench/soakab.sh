#!/usr/bin/env bash
# Singles of one tenant (32 clients) on databases in different states or
# schemas, in short bursts interleaved (A B B A ...), each burst right after
# a CHECKPOINT: what a soak's later windows pay (full-page images of every
# page first touched after a checkpoint, a hot index larger than the cache)
# told apart from the machine's load, which moves both alike.
#   VARIANTS   names of the variants ("fresh aged"): each has a database
#              ${DB}_<name>, its own serve, and optionally
#              SEED_<name>   idempotency records of the tenant put in its
#                            hot partition before the first burst (a soak's
#                            minutes of keys, in seconds);
#              SETUP_<name>  SQL run after migrate;
#              BIN_<name>    the overage binary (default bin/overage).
#   ORDER      the bursts ("fresh aged aged fresh"), BURST seconds each (20).
# Per burst: events/s, p99; this database's WAL bytes and full-page images
# an event, and the three relations with most images (pg_walinspect); the
# blocks its backends read into shared buffers an event (not found there);
# the whole server's WAL and images an event (pg_stat_wal); CPU µs an
# event of serve and of the database's backends.
set -euo pipefail
cd "$(dirname "$0")/.."
DB=${DB:-overage_ab}
VARIANTS=${VARIANTS:-fresh aged}
ORDER=${ORDER:-fresh aged aged fresh}
BURST=${BURST:-20}
. bench/lib.sh
go build -o bin/ingestload ./bench/ingestload
go build -o bin/overage ./cmd/overage
declare -A SERVE ADDR
# The WAL of a burst is kept for pg_walinspect by a temporary replication
# slot of a session that sleeps through it (at most 300 s, and ended after
# each burst): other sessions' checkpoints would recycle it otherwise.
SLOT_APP=soakab_slot_$$
unslot() { psql -qtA "$PGHOST_URL" -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '$SLOT_APP'" >/dev/null; }
slot() {
  PGAPPNAME=$SLOT_APP psql -qtA "$PGHOST_URL" -c "SELECT pg_create_physical_replication_slot('$SLOT_APP', true, true)" -c "SELECT pg_sleep(300)" >/dev/null 2>&1 &
  for _ in $(seq 1 100); do
    [ "$(psql -qtA "$PGHOST_URL" -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$SLOT_APP'")" = 1 ] && break
    sleep 0.1
  done
}
trap 'unslot; for v in ${!SERVE[@]}; do kill ${SERVE[$v]} 2>/dev/null || true; done' EXIT
port=18961
for v in $VARIANTS; do
  url=$(db_url "${DB}_$v")
  psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS ${DB}_$v WITH (FORCE)" -c "CREATE DATABASE ${DB}_$v"
  bin=BIN_$v; bin=${!bin:-./bin/overage}
  "$bin" migrate --database-url "$url" >/dev/null 2>&1
  psql -q "$url" -f bench/setup.sql
  setup=SETUP_$v; [ -n "${!setup:-}" ] && psql -q "$url" -c "${!setup}"
  psql -q "$url" -c "CREATE EXTENSION IF NOT EXISTS pg_walinspect"
  ADDR[$v]=127.0.0.1:$port; port=$((port + 1))
  LOG_LEVEL=warn DATABASE_URL="$url" LISTEN_ADDR=${ADDR[$v]} "$bin" serve &
  SERVE[$v]=$!
  for _ in $(seq 1 100); do curl -fs "http://${ADDR[$v]}/readyz" >/dev/null && break; sleep 0.1; done
  seed=SEED_$v
  if [ -n "${!seed:-}" ]; then
    # One real record of the tenant as the pattern, then its copies under
    # other keys, expiring over the last minutes as a soak's would.
    ./bin/ingestload -url "http://${ADDR[$v]}" -duration 1s -clients 1 -tenants 1 >/dev/null 2>&1
    psql -q "$url" -c "INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, usage_log_id, expires_at)
      SELECT r.tenant_id, 'seed-' || g || '-' || r.idempotency_key, r.fingerprint, r.response_status, r.response_body, r.usage_log_id,
             r.expires_at - (${!seed} - g) * interval '1 ms'
      FROM (SELECT * FROM idempotency_keys LIMIT 1) r, generate_series(1, ${!seed}) g"
  fi
done
cpu() { # CPU seconds of serve $1 and of database $2's backends
  local s b=0 c
  s=$(awk '{print ($14+$15)/100}' /proc/$1/stat)
  for p in $(psql -qtA "$PGHOST_URL" -c "SELECT pid FROM pg_stat_activity WHERE datname = '$2'"); do
    c=$(awk '{print ($14+$15)/100}' /proc/$p/stat 2>/dev/null || echo 0)
    b=$(python3 -c "print($b + $c)")
  done
  echo "$s $b"
}
wal() { psql -qtA "$PGHOST_URL" -F ' ' -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, wal_fpi, pg_current_wal_lsn() FROM pg_stat_wal"; }
# fpi URL FROM TO: this database's WAL between two LSNs (pg_walinspect):
# bytes of the records that touch its blocks, their full-page images, and
# the images per relation (the three with most).
fpi() {
  psql -qtA "$1" -F ' ' -c "WITH b AS (
      SELECT w.start_lsn, w.record_length, m[2] AS rel, m[3] IS NOT NULL AS fpw
      FROM pg_get_wal_records_info('$2', '$3') w,
        regexp_matches(w.block_ref, 'rel [0-9]+/([0-9]+)/([0-9]+) fork main blk [0-9]+( \\(FPW\\))?', 'g') m
      WHERE m[1]::oid = (SELECT oid FROM pg_database WHERE datname = current_database())),
    r AS (SELECT DISTINCT ON (start_lsn) start_lsn, record_length FROM b),
    per AS (SELECT coalesce(c.relname, b.rel) AS rel, count(*) AS n FROM b LEFT JOIN pg_class c ON c.relfilenode = b.rel::oid
      WHERE fpw GROUP BY 1 ORDER BY 2 DESC LIMIT 3)
    SELECT (SELECT sum(record_length) FROM r), (SELECT count(*) FROM b WHERE fpw), coalesce((SELECT string_agg(rel || ':' || n, ',') FROM per), '-')"
}
for v in $ORDER; do
  url=$(db_url "${DB}_$v")
  psql -q "$url" -c CHECKPOINT
  slot
  read -r n0 <<<"$(psql -qtA "$url" -c "SELECT count(*) FROM idempotency_keys")"
  read -r r0 <<<"$(psql -qtA "$url" -c "SELECT blks_read FROM pg_stat_database WHERE datname = current_database()")"
  read -r w0 f0 l0 <<<"$(wal)"; read -r s0 b0 <<<"$(cpu ${SERVE[$v]} ${DB}_$v)"
  ./bin/ingestload -url "http://${ADDR[$v]}" -duration "${BURST}s" -clients 32 -tenants 1 2>/dev/null > "/tmp/${DB}_$v.json" || true
  read -r w1 f1 l1 <<<"$(wal)"
  read -r s1 b1 <<<"$(cpu ${SERVE[$v]} ${DB}_$v)"
  sleep 1 # the backends' block counts reach pg_stat_database when they go idle
  read -r r1 <<<"$(psql -qtA "$url" -c "SELECT blks_read FROM pg_stat_database WHERE datname = current_database()")"
  read -r dw df dper <<<"$(fpi "$url" "$l0" "$l1")"
  unslot
  python3 - "$v" "/tmp/${DB}_$v.json" "$n0" "$w0" "$w1" "$f0" "$f1" "$s0" "$s1" "$b0" "$b1" "$(cut -d' ' -f1 /proc/loadavg)" "${dw:-0}" "${df:-0}" "${dper:--}" "$r0" "$r1" <<'PY'
import json, sys
v, f = sys.argv[1], sys.argv[2]
n0, w0, w1, f0, f1 = map(int, sys.argv[3:8])
s0, s1, b0, b1 = map(float, sys.argv[8:12])
r = json.load(open(f))
n = max(r["events"], 1)
dw, df = int(sys.argv[13] or 0), int(sys.argv[14] or 0)
print(f"{v:<10} keys before {n0:>9}  events/s {r['events_per_s']:6.0f}  p99 {r['p99_ms']:6.1f} ms"
      f"  this database: WAL/event {dw / n:5.0f} B  FPI/event {df / n:5.3f} ({sys.argv[15]})"
      f"  blocks read into shared buffers/event {(int(sys.argv[17]) - int(sys.argv[16])) / n:5.2f}"
      f"  server: WAL/event {(w1 - w0) / n:5.0f} B  FPI/event {(f1 - f0) / n:5.2f}"
      f"  CPU/event serve {(s1 - s0) / n * 1e6:4.0f} µs backends {(b1 - b0) / n * 1e6:4.0f} µs  load {sys.argv[12]}")
PY
done
for v in $VARIANTS; do psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS ${DB}_$v WITH (FORCE)"; done
