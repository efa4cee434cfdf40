#!/usr/bin/env bash
# Soak, volume and storage benchmarks, each on a fresh database with no
# manual VACUUM or ANALYZE: the product as it is deployed, keeping its own
# plans and statistics or not.
#   soak:    single events of ONE tenant from 32 clients, then batches of 100
#            events of 100 tenants from 8 clients, each for SOAK_SECONDS
#            (600), events/s and p99 per 30 s window; the single events'
#            rate against ref_single.pgbench (32 clients) run right after,
#            on its own fresh database, for 60 s; then ref_batch.pgbench (8
#            clients) for SOAK_SECONDS on its own fresh database, per 30 s
#            window: how far PostgreSQL's floor itself falls as its tables
#            grow, beside the batches' fall;
#   volume:  the same two loads for VOLUME_SECONDS (120) after seeding
#            VOLUME_LOGS (20,000,000) billed usage logs over the 100 tenants
#            and VOLUME_KEYS (10,000,000) live idempotency records of the
#            single-event tenant, against the same load on empty tables,
#            run empty, seeded, seeded, empty and summed, the empty runs
#            on one database so that each side's windows follow the same
#            earlier loads;
#   storage: bytes on disk per event (heap + indexes + TOAST) of each table
#            after the soak's singles and after its batches.
# SOAK_ONLY=1 skips the volume runs; VOLUME_ONLY=1 skips the soak.
# VOLUME_SEED_ONLY=1 seeds ${BENCH_DB}_vol and stops, keeping it;
# VOLUME_REUSE=1 then runs the loads on it instead of seeding anew (the
# seed takes 15-25 minutes here), and only if its seed finished (a
# comment on the database says so). VOLUME_PACK=0 skips the retention
# run that packs the seeded month, as work's daily run would. The
# server's memory, WAL and autovacuum settings are printed first: at
# volume they decide the ratio
# (docs/limits.md, "PostgreSQL at volume"). The
# volume runs are ordered empty, seeded (singles), seeded, empty (batches),
# each pair back to back, so a load that drifts on a shared machine moves
# both sides of a ratio alike; the seeded database is made first.
set -euo pipefail
cd "$(dirname "$0")/.."
SOAK_SECONDS=${SOAK_SECONDS:-600}
VOLUME_SECONDS=${VOLUME_SECONDS:-120}
VOLUME_LOGS=${VOLUME_LOGS:-20000000}
VOLUME_KEYS=${VOLUME_KEYS:-10000000}
# When the seeded logs were recorded (an SQL expression): by default ten
# days before the current UTC month, so they are last month's whatever
# the day of the run. (On a new database they still share the first
# partition with the loads' logs: it spans the months to the month after
# next, docs/benchmarks.md, "Fitting a new database's first partitions".)
VOLUME_SEED_AT=${VOLUME_SEED_AT:-"date_trunc('month', now(), 'UTC') - interval '10 days'"}
BENCH_DB=${BENCH_DB:-overage_soak}
ADDR=${BENCH_ADDR:-127.0.0.1:18082}
. bench/lib.sh
URL=$(db_url $BENCH_DB)
REF_URL=$(db_url ${BENCH_DB}_ref)
go build -o bin/ingestload ./bench/ingestload
# Always built: a binary left in bin/ by an older checkout would be measured instead.
go build -o bin/overage ./cmd/overage

# recreate DB: drop (a checkpoint, when DB exists) and create DB.
recreate() { psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" -c "CREATE DATABASE $1"; }
# fresh [DB]: drop, create and migrate DB ($BENCH_DB), with the bench tenants.
fresh() {
  local db=${1:-$BENCH_DB}
  recreate "$db"
  ./bin/overage migrate --database-url "$(db_url "$db")" >/dev/null 2>&1
  psql -q "$(db_url "$db")" -f bench/setup.sql
}
SERVE=
# serve [URL]: overage serve on URL ($URL) in the background.
serve() {
  LOG_LEVEL=warn DATABASE_URL="${1:-$URL}" LISTEN_ADDR=$ADDR ./bin/overage serve &
  SERVE=$!
  for _ in $(seq 1 100); do curl -fs "http://$ADDR/readyz" >/dev/null && break; sleep 0.1; done
}
# An if, not `[ … ] &&`: under set -e a false test would make the EXIT
# trap, and so the script, exit 1 after a run that went well.
stop() { if [ -n "$SERVE" ]; then kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null || true; SERVE=; fi; }
trap stop EXIT
# load NAME SECONDS FLAGS...: one ingestload run; its JSON in /tmp/$BENCH_DB.NAME.json.
load() {
  local name=$1 secs=$2; shift 2
  ./bin/ingestload -url "http://$ADDR" -duration "${secs}s" -window 30s "$@" 2>/dev/null > "/tmp/$BENCH_DB.$name.json" || true
}
single() { load "$1" "$2" -clients 32 -tenants 1; }
batch() { load "$1" "$2" -clients 8 -tenants 100 -batch 100; }
# size NAME TABLE EVENTS: bytes per event of TABLE (all partitions): the
# total, then heap (with its free space and visibility maps), TOAST and
# each index (an index of several partitions by its partition's name less
# the partition's, as "_key").
size() {
  psql -qtA "$URL" <<SQL
WITH p AS (SELECT relid FROM pg_partition_tree('$2') WHERE isleaf
    UNION ALL SELECT oid FROM pg_class WHERE oid = '$2'::regclass AND relkind = 'r'), n AS (SELECT greatest($3, 1)::numeric AS n)
SELECT '$1 $2 ' || round(sum(pg_total_relation_size(relid)) / n)
    || ' (heap ' || round(sum(pg_table_size(relid) - coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0)) / n)
    || ', toast ' || round(sum(coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0)) / n)
    || ', indexes ' || round(sum(pg_indexes_size(relid)) / n) || ')'
  FROM p JOIN pg_class c ON c.oid = p.relid, n GROUP BY n.n
UNION ALL
SELECT '  index ' || name || ' ' || round(sum(bytes) / max(n.n), 1)
  FROM (SELECT regexp_replace(i.indexrelid::regclass::text, '^' || c.relname, '$2') AS name, pg_relation_size(i.indexrelid) AS bytes
    FROM p JOIN pg_class c ON c.oid = p.relid JOIN pg_index i ON i.indrelid = p.relid) x, n
  GROUP BY name HAVING sum(bytes) > 8192 * count(*);
SQL
}
windows() {
  python3 - "$@" <<'PY'
import json, sys
for name in sys.argv[1:]:
    r = json.load(open(f"/tmp/{name}.json"))
    w = r.get("windows") or [{"events_per_s": 0, "p99_ms": 0}]
    print(f"{name.split('.', 1)[1]:<16} events/s {r['events_per_s']:8.0f}  p99 {r['p99_ms']:7.1f} ms  errors {r['errors']}"
          f"  first 30 s {w[0]['events_per_s']:7.0f}  last 30 s {w[-1]['events_per_s']:7.0f}  last/first {w[-1]['events_per_s'] / max(w[0]['events_per_s'], 1):.2f}")
    # One window moves by up to a sixth against its neighbours on a two-core
    # machine while PostgreSQL's CPU per window holds (docs/benchmarks.md,
    # "Three more batch runs on huge pages"): the mean of three windows at
    # each end is printed beside the goal's ratio, to tell a fall from noise.
    if len(w) >= 6:
        end = lambda ws: sum(x['events_per_s'] for x in ws) / 3
        print(f"  mean of the last three windows / of the first three {end(w[-3:]) / max(end(w[:3]), 1):.2f}")
    print("  per window (events/s, p99 ms): " + ", ".join(f"{x['events_per_s']:.0f}/{x['p99_ms']:.0f}" for x in w))
PY
}

# server: the settings each ratio depends on (docs/limits.md, "PostgreSQL
# at volume"), huge_pages among them.
server() {
  psql -qtA "$PGHOST_URL" -c "SELECT 'server: ' || string_agg(name || '=' || current_setting(name), ' ' ORDER BY name) FROM unnest(ARRAY['shared_buffers', 'max_wal_size', 'checkpoint_timeout', 'wal_compression', 'autovacuum', 'huge_pages']) name"
}

if [ -z "${VOLUME_ONLY:-}" ]; then
echo "== soak: ${SOAK_SECONDS}s each, fresh databases, no VACUUM or ANALYZE"
server
fresh; serve; echo "singles from $(date -u +%T): $(memory)"; single soak_single "$SOAK_SECONDS"; stop
n=$(psql -qtA "$URL" -c "SELECT count(*) FROM usage_logs")
echo "storage after $n single events (bytes per event):"
size single usage_logs "$n"; size single idempotency_keys "$n"; size single river_job "$n"
fresh; serve; echo "batches from $(date -u +%T): $(memory)"; batch soak_batch "$SOAK_SECONDS"; stop
n=$(psql -qtA "$URL" -c "SELECT count(*) FROM usage_logs")
echo "storage after $n batched events (bytes per event):"
size batch usage_logs "$n"; size batch idempotency_keys "$n"; size batch river_job "$n"
nbatch=$n
fresh_ref() { recreate ${BENCH_DB}_ref; psql -q "$REF_URL" -f bench/reference.sql; }
fresh_ref
tps=$(pgbench -n -c 32 -j 2 -T 60 -f bench/ref_single.pgbench "$REF_URL" 2>&1 | sed -n 's/^tps = \([0-9.]*\) .*/\1/p' | tail -1)
# The floor's own fall: ref_batch.pgbench (1,000 events a transaction,
# bench/reference.sql: no product, two unique indexes) from 8 clients on a
# fresh database for as long as the product's batches, its rate per 30 s
# window. Dropping ref_single's database forces a checkpoint just before
# it, as dropping the singles' one did before the product's batches;
# otherwise the batches' gigabytes of WAL bring one into its first
# minutes, and full-page images, not its tables, decide its fall. It
# writes faster than the product, so its fall is also read at the window
# where it holds as many logs as the product's batches left.
fresh_ref
pgbench -n -c 8 -j 2 -T "$SOAK_SECONDS" -P 30 -f bench/ref_batch.pgbench "$REF_URL" > "/tmp/$BENCH_DB.ref_batch.txt" 2>&1 || true
windows $BENCH_DB.soak_single $BENCH_DB.soak_batch
python3 - "$tps" "/tmp/$BENCH_DB.soak_single.json" <<'PY'
import json, sys
tps, r = float(sys.argv[1]), json.load(open(sys.argv[2]))
print(f"single events over the soak {r['events_per_s']:.0f}/s against ref_single.pgbench {tps:.0f}/s: ratio {r['events_per_s'] / tps:.2f}")
PY
python3 - "/tmp/$BENCH_DB.ref_batch.txt" "$nbatch" <<'PY'
import re, sys
# pgbench -P 30: a progress line each 30 s, its tps of 1,000-event transactions.
w = [float(x) * 1000 for x in re.findall(r"^progress: [0-9.]+ s, ([0-9.]+) tps", open(sys.argv[1]).read(), re.M)] or [0]
logs, at, total = int(sys.argv[2]), len(w) - 1, 0
for i, r in enumerate(w):
    total += r * 30
    if total >= logs:
        at = i
        break
print(f"ref_batch.pgbench events/s {sum(w) / len(w):8.0f}  first 30 s {w[0]:7.0f}  last 30 s {w[-1]:7.0f}  last/first {w[-1] / max(w[0], 1):.2f}")
print(f"  at the batches' {logs} logs (window {at + 1}): {w[at]:.0f} events/s, {w[at] / max(w[0], 1):.2f} of its first")
print("  per window (events/s): " + ", ".join(f"{x:.0f}" for x in w))
PY
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS ${BENCH_DB}_ref WITH (FORCE)"
fi
[ -n "${SOAK_ONLY:-}" ] && { psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)"; exit 0; }

echo "== volume: ${VOLUME_SECONDS}s each, empty tables, then $VOLUME_LOGS logs and $VOLUME_KEYS keys seeded"
server
VOL_DB=${BENCH_DB}_vol
VOL_URL=$(db_url $VOL_DB)
SEEDED="seeded $VOLUME_LOGS logs at $VOLUME_SEED_AT and $VOLUME_KEYS keys, pack ${VOLUME_PACK:-1}"
if [ -n "${VOLUME_REUSE:-}" ] && [ "$(psql -qtA "$PGHOST_URL" -c "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = '$VOL_DB'")" = "$SEEDED" ]; then
  ./bin/overage migrate --database-url "$VOL_URL" >/dev/null 2>&1
  echo "reusing $VOL_DB ($SEEDED)"
else
echo "seeding $VOL_DB: $(date -u +%T), load average $(cut -d' ' -f1-3 /proc/loadavg)"
fresh $VOL_DB
# Billed logs of last month spread over the 100 tenants, and one day of the
# single-event tenant's keys, the counters kept by their trigger.
# Their overage equals their tokens, so it is stored NULL, as ingest stores
# it (migrations/0069).
psql -q "$VOL_URL" -v seed_at="($VOLUME_SEED_AT)" <<SQL
INSERT INTO usage_logs (id, tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens,
    period_start, overage_input_tokens, overage_output_tokens, billing_status, billed_at, created_at, updated_at)
SELECT (lpad(to_hex(floor(extract(epoch FROM :seed_at) * 1000)::bigint), 12, '0') || '7' || lpad(to_hex(g % 4096), 3, '0') || '8' || lpad(to_hex(g), 15, '0'))::uuid, ('00000000-0000-0000-0000-' || lpad((g % 100 + 1)::text, 12, '0'))::uuid, 'seed-' || g,
    :seed_at, 'u', 'm', 100, 20, date_trunc('month', :seed_at, 'UTC'), NULL, NULL,
    'billed', now(), :seed_at, :seed_at
FROM generate_series(1, $VOLUME_LOGS) g;
INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
SELECT '00000000-0000-0000-0000-000000000001', 'seed-' || g, '\x00', 202, '\x7b7d', now() + (g % 86000) * interval '1 second'
FROM generate_series(1, $VOLUME_KEYS) g;
SQL
# The seeded month is over and billed: the daily retention run of
# `overage work` packs its indexes (docs/retention.md, "Packing a month
# that is over") a day after the month ends, so a deployment's past
# months are packed (on a month's first day it packs nothing yet, and the
# table it prints says so). VOLUME_PACK=0 leaves it as the seed wrote it.
if [ "${VOLUME_PACK:-1}" != 0 ]; then
  echo "retention on $VOL_DB, as work's daily run: $(date -u +%T)"
  ./bin/overage retention --database-url "$VOL_URL" 2>&1 | sed 's/^/  /'
fi
echo "COMMENT ON DATABASE $VOL_DB IS :'seeded'" | psql -q "$PGHOST_URL" -v seeded="$SEEDED"
echo "seeded: $(date -u +%T), load average $(cut -d' ' -f1-3 /proc/loadavg)"
[ -n "${VOLUME_SEED_ONLY:-}" ] && exit 0
fi
# Each kind empty, seeded, seeded, empty (A B B A), the empty windows on
# one database made before the first load and the seeded ones on the
# seeded database, so the two sides differ by the seed alone: each window
# of a side follows the same loads on that side (the singles, then the
# first batch window), and each side's current month has grown alike by
# its start. Empty windows on a database of their own each would compare
# a seeded month holding the earlier windows' millions of logs with one
# holding none: a month's own growth cost batches about 10% over four
# minutes with 128 MB of shared_buffers (docs/benchmarks.md, "A side's
# own writes"). The empty database
# is made before the first load: DROP DATABASE forces an immediate
# checkpoint, after which the first change of every page of the seeded
# database writes it whole into the WAL while the empty one, newer than
# the checkpoint, writes none; empty databases dropped and made between
# the loads let the harness, not the volume, decide the seeded windows
# (docs/benchmarks.md, "The volume run diagnosed"). Checkpoints come as
# in a deployment, every checkpoint_timeout or max_wal_size.
EMPTY_URL=$(db_url ${BENCH_DB}_empty)
fresh ${BENCH_DB}_empty
ckpt() { psql -qtA "$PGHOST_URL" -c "SELECT 'checkpoints so far: ' || checkpoints_timed || ' timed, ' || checkpoints_req || ' requested' FROM pg_stat_bgwriter"; }
echo "loads from $(date -u +%T), load average $(cut -d' ' -f1-3 /proc/loadavg), $(ckpt)"
for kind in single batch; do
  serve "$EMPTY_URL"; $kind empty_${kind}_1 "$VOLUME_SECONDS"; stop
  serve "$VOL_URL"; $kind volume_${kind}_1 "$VOLUME_SECONDS"; $kind volume_${kind}_2 "$VOLUME_SECONDS"; stop
  serve "$EMPTY_URL"; $kind empty_${kind}_2 "$VOLUME_SECONDS"; stop
  echo "$kind loads done: $(date -u +%T), load average $(cut -d' ' -f1-3 /proc/loadavg), $(ckpt)"
done
windows $BENCH_DB.empty_single_1 $BENCH_DB.volume_single_1 $BENCH_DB.volume_single_2 $BENCH_DB.empty_single_2 \
  $BENCH_DB.empty_batch_1 $BENCH_DB.volume_batch_1 $BENCH_DB.volume_batch_2 $BENCH_DB.empty_batch_2
python3 - "$BENCH_DB" <<'PY'
import json, sys
b = sys.argv[1]
rate = lambda name: json.load(open(f"/tmp/{b}.{name}.json"))["events_per_s"]
for kind in ("single", "batch"):
    e = sum(rate(f"empty_{kind}_{i}") for i in (1, 2))
    v = sum(rate(f"volume_{kind}_{i}") for i in (1, 2))
    print(f"volume {kind}: {v / 2:.0f} events/s at volume against {e / 2:.0f} on empty tables (A B B A): ratio {v / max(e, 1):.2f}")
PY
# Bytes per event of each kind are the soak's, which runs each kind on a
# fresh database (VOLUME_ONLY=1 skips it): the volume run's empty
# database holds both kinds.
# A seeded database the loads have written to is not reused.
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)" -c "DROP DATABASE IF EXISTS $VOL_DB WITH (FORCE)"
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS ${BENCH_DB}_empty WITH (FORCE)"
