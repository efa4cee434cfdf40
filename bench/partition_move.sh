#!/usr/bin/env bash
# The move of usage_logs and usage_reports to partitioned tables
# (migrations 0054-0059) on a database of MOVE_LOGS (20,000,000) usage logs
# while the release before it serves single events from MOVE_CLIENTS (8)
# clients and `overage work` bills them to the Stripe emulator: prints the
# migration's duration, the longest any request waited (the ingest stall)
# and whether every event answered is one log billed once
# (bench/partitionmove). The previous release is built from OLD_REV (the
# commit before 0054 was added).
set -euo pipefail
cd "$(dirname "$0")/.."
MOVE_LOGS=${MOVE_LOGS:-20000000}
MOVE_CLIENTS=${MOVE_CLIENTS:-8}
MOVE_AROUND=${MOVE_AROUND:-10s}
BENCH_DB=${BENCH_DB:-overage_partition_move}
OLD_REV=${OLD_REV:-$(git log --diff-filter=A --format=%H -1 -- migrations/0054_usage_logs_bound.sql)^}
. bench/lib.sh
URL=$(db_url $BENCH_DB)

old=$(mktemp -d)
trap 'rm -rf "$old"' EXIT
git archive "$OLD_REV" | tar -x -C "$old"
(cd "$old" && go build -o bin/overage ./cmd/overage)
mkdir -p bin
cp "$old/bin/overage" bin/overage-old
go build -o bin/overage ./cmd/overage
go build -o bin/partitionmove ./bench/partitionmove

psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)" -c "CREATE DATABASE $BENCH_DB"
./bin/overage-old migrate --database-url "$URL" >/dev/null
psql -q "$URL" -f bench/setup.sql
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) before the run"
./bin/partitionmove -database-url "$URL" -old-bin ./bin/overage-old -bin ./bin/overage \
  -logs "$MOVE_LOGS" -clients "$MOVE_CLIENTS" -around "$MOVE_AROUND"
echo "machine: load average $(cut -d' ' -f1-3 /proc/loadavg) after the run"
psql -q "$PGHOST_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)"
