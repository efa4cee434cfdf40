#!/usr/bin/env bash
# PostgreSQL alone under the soak's batched shape, with nothing of the
# product: 8 clients each inserting 100 rows of one of 100 tenants a
# transaction into one table, on a fresh database after a checkpoint, for
# PLAIN_SECONDS (300), its rate per 30 s window (pgbench -P 30). It tells
# how far a plain insert load falls on this machine as its table grows
# and the machine's memory fills, beside the product's soak:
#   digest: a unique index on the md5 digest of tenant and request_id
#           (the product's request key) and a lookup of the 100 digests
#           before the insert, as ingest does;
#   nolookup: the same index, no lookup;
#   plain:  no digest index at all (a bigserial primary key and the
#           pending index only), no lookup.
# Usage: bench/plainfall.sh [digest|nolookup|plain]... (all three).
# docs/benchmarks.md, "The batch soak on huge pages".
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
DB=${BENCH_DB:-overage_plainfall}
URL=$(db_url "$DB")
SECS=${PLAIN_SECONDS:-300}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Both scripts pick a tenant and a batch; the lookup script reads the
# batch's 100 digests through the index before the insert, as ingest does.
head='\set t random(1, 100)
\set k random(1, 4000000000000000000)
BEGIN;'
insert="INSERT INTO logs (tenant_id, request_id, ts, user_id, model_id, input_tokens, output_tokens, billing_status)
  SELECT ('00000000-0000-0000-0000-' || lpad(:t::text, 12, '0'))::uuid, :k || '-' || g, now(), 'u_42', 'gpt-4o', 1200, 350, 'pending'
  FROM generate_series(1, 100) g;
COMMIT;"
lookup="SELECT count(*) FROM logs WHERE request_id IS NOT NULL AND md5(tenant_id::text || request_id)::uuid = ANY (ARRAY(
  SELECT md5(('00000000-0000-0000-0000-' || lpad(:t::text, 12, '0')) || (:k || '-' || g))::uuid FROM generate_series(1, 100) g));"
printf '%s\n%s\n' "$head" "$insert" > "$dir/insert.pgbench"
printf '%s\n%s\n%s\n' "$head" "$lookup" "$insert" > "$dir/lookup.pgbench"
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(digest nolookup plain)
for v in "${variants[@]}"; do
  psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" -c CHECKPOINT
  psql -q "$URL" -c "CREATE TABLE logs (id bigserial PRIMARY KEY, tenant_id uuid NOT NULL, request_id text, ts timestamptz NOT NULL,
      user_id text NOT NULL, model_id text NOT NULL, input_tokens bigint NOT NULL, output_tokens bigint NOT NULL,
      billing_status text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())" \
    -c "CREATE INDEX ON logs (tenant_id, created_at) WHERE billing_status = 'pending'"
  script=insert
  case $v in
    digest) script=lookup ;&
    nolookup) psql -q "$URL" -c "CREATE UNIQUE INDEX logs_request_key ON logs ((md5(tenant_id::text || request_id)::uuid)) WHERE request_id IS NOT NULL" ;;
    plain) ;;
    *) echo "unknown variant $v" >&2; exit 2 ;;
  esac
  echo "== $v, from $(date -u +%T): $(memory)"
  pgbench -n -c 8 -j 2 -T "$SECS" -P 30 -f "$dir/$script.pgbench" "$URL" 2>&1 | python3 -c '
import re, sys
w = [float(x) * 100 for x in re.findall(r"^progress: [0-9.]+ s, ([0-9.]+) tps", sys.stdin.read(), re.M)] or [0]
print(f"  events/s {sum(w) / len(w):8.0f}  first 30 s {w[0]:7.0f}  last 30 s {w[-1]:7.0f}  last/first {w[-1] / max(w[0], 1):.2f}")
print("  per window: " + ", ".join(f"{x:.0f}" for x in w))'
done
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
