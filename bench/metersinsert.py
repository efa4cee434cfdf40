#!/usr/bin/env python3
"""usagelog.InsertSQL of 1,000 logs in psql, three shapes side by side.

  A  the two default meters (meter_keys NULL);
  B  three meters a log (m_input, m_cache, m_output), today's arrays;
  N  the same three lines in the narrower layout of
     bench/meters_narrow_prototype.sql (meter_ids smallint[], meter_lines
     bigint[] of tokens and overage pairs).

Each shape gets a fresh database on DATABASE_URL's server (`overage
migrate`, bench/setup.sql, the catalog for B and N), then RUNS (20)
inserts of the same 1,000 logs of one tenant, half with overage, each
under EXPLAIN (ANALYZE, WAL) and rolled back, in the order A B N N B A.
Printed per shape: the minimum execution time, the minimum time of each
insert trigger, WAL bytes a log and a row's size (pg_column_size of the
row, once 1,000 logs are committed). Run from the repository root after
`go build -o bin/overage ./cmd/overage`.
"""
import os
import re
import subprocess
import urllib.parse as up

SERVER = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
RUNS = int(os.environ.get("RUNS", "20"))
PREFIX = os.environ.get("PREFIX", "minsert")
N = 1000
TYPES = ("uuid, uuid[], text[], timestamptz[], text[], text[], bigint[], bigint[], timestamptz[], bigint[], bigint[], "
         "text[], timestamptz, bigint[], bigint[], bigint[], {k17}, bigint[], bigint[], int[], int[], bool[], uuid[], "
         "text[], text[], text[]")


def url(db):
    return up.urlparse(SERVER)._replace(path="/" + db).geturl()


def psql(db, *args, **kw):
    return subprocess.run(["psql", "-qX", "-v", "ON_ERROR_STOP=1", url(db), *args], capture_output=True, text=True,
                          check=True, **kw).stdout


def fresh(side):
    db = f"{PREFIX}_{side.lower()}"
    psql("postgres", "-c", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", "-c", f"CREATE DATABASE {db}")
    subprocess.run(["./bin/overage", "migrate", "--database-url", url(db)], check=True, capture_output=True)
    psql(db, "-f", "bench/setup.sql")
    if side != "A":
        subprocess.run(["bash", "-c", f'. bench/meters.lib.sh && create_meters "{url(db)}"'], check=True)
    if side == "N":
        psql(db, "-f", "bench/meters_narrow_prototype.sql")
    return db


def arrays(side):
    """The insert's 26 arguments, as SQL expressions."""
    g = f"generate_series(1, {N}) g"
    v7 = "(lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0') || '7' || substr(md5(random()::text), 1, 19))::uuid"
    a = ["'00000000-0000-0000-0000-000000000001'", f"(SELECT array_agg({v7}) FROM {g})",
         f"(SELECT array_agg('r-' || gen_random_uuid()) FROM {g})", f"(SELECT array_agg(now()) FROM {g})",
         f"(SELECT array_agg('user-' || (g % 7)) FROM {g})", f"(SELECT array_agg('gpt-4o'::text) FROM {g})",
         f"(SELECT array_agg(1200::bigint) FROM {g})", f"(SELECT array_agg(350::bigint) FROM {g})",
         f"(SELECT array_agg('2026-12-01'::timestamptz) FROM {g})"]
    if side == "A":
        a += [f"(SELECT array_agg(CASE WHEN g % 2 = 1 THEN 1200 ELSE 0 END::bigint) FROM {g})",
              f"(SELECT array_agg(CASE WHEN g % 2 = 1 THEN 350 ELSE 0 END::bigint) FROM {g})"]
    else:
        a += [f"(SELECT array_agg(0::bigint) FROM {g})"] * 2
    a += [f"(SELECT array_agg(CASE WHEN g % 2 = 1 THEN 'pending' ELSE 'not_billable' END) FROM {g})", "now()",
          f"(SELECT array_agg(800::bigint) FROM {g})", "NULL", "NULL"]
    lines = f"{g}, unnest(ARRAY[400, 800, 350]::bigint[]) WITH ORDINALITY AS t (x, k)"
    if side == "A":
        a += ["NULL"] * 5
    elif side == "B":
        a += [f"(SELECT array_agg('m_input,m_cache,m_output'::text) FROM {g})",
              f"(SELECT array_agg(x ORDER BY g, k) FROM {lines})",
              f"(SELECT array_agg(CASE WHEN g % 2 = 1 THEN x ELSE 0 END ORDER BY g, k) FROM {lines})",
              f"(SELECT array_agg((g - 1) * 3) FROM {g})", f"(SELECT array_agg(3) FROM {g})"]
    else:
        a += [f"(SELECT array_agg(x ORDER BY g, k) FROM {g}, unnest(ARRAY[3, 4, 5]::smallint[]) WITH ORDINALITY AS t (x, k))",
              f"(SELECT array_agg(v ORDER BY g, k, j) FROM {lines}, LATERAL (VALUES (1, x), (2, CASE WHEN g % 2 = 1 THEN x ELSE 0 END)) AS p (j, v))",
              "NULL", f"(SELECT array_agg((g - 1) * 3) FROM {g})", f"(SELECT array_agg(3) FROM {g})"]
    return a + ["NULL"] * 5


def script(side, sql, runs, explain=True):
    if side == "N":
        sql = sql.replace("meter_keys, meter_tokens, meter_overage, stripe_timestamp", "meter_ids, meter_lines, stripe_timestamp")
        sql = re.sub(r"string_to_array\(u\.mk, ','\),\s*CASE WHEN u\.cnt > 0 THEN \(\$18::bigint\[\]\)\[u\.lo \+ 1 : u\.lo \+ u\.cnt\] END,\s*"
                     r"CASE WHEN u\.cnt > 0 THEN \(\$19::bigint\[\]\)\[u\.lo \+ 1 : u\.lo \+ u\.cnt\] END,",
                     "CASE WHEN u.cnt > 0 THEN ($17::smallint[])[u.lo + 1 : u.lo + u.cnt] END,\n"
                     "CASE WHEN u.cnt > 0 THEN ($18::bigint[])[2 * u.lo + 1 : 2 * (u.lo + u.cnt)] END,", sql)
        sql = sql.replace("$17::text[], $20::int[]", "$20::int[]").replace("rs, mk, lo, cnt", "rs, lo, cnt")
        assert "meter_keys" not in sql and "u.mk" not in sql, "InsertSQL changed: update the narrow shape"
    a = arrays(side)
    out = [f"PREPARE ins ({TYPES.format(k17='smallint[]' if side == 'N' else 'text[]')}) AS {sql};",
           "SELECT " + ", ".join(f"({e})::text AS v{i + 1}" for i, e in enumerate(a)) + " \\gset"]
    call = ", ".join("NULL" if e == "NULL" else f":'v{i + 1}'" for i, e in enumerate(a))
    for _ in range(runs):
        if explain:
            out.append(f"BEGIN;\nEXPLAIN (ANALYZE, WAL, COSTS OFF, SUMMARY ON) EXECUTE ins({call});\nROLLBACK;")
        else:
            out.append(f"EXECUTE ins({call});")
    return "\n".join(out) + "\n"


def main():
    sql = subprocess.run(["go", "run", "./bench/insertsql"], capture_output=True, text=True, check=True).stdout
    dbs = {s: fresh(s) for s in "ABN"}
    res = {s: {"exec": [], "period": [], "billing": [], "wal": []} for s in "ABN"}
    for s in "ABNNBA":
        t = psql(dbs[s], input=script(s, sql, RUNS // 2))
        res[s]["exec"] += [float(x) for x in re.findall(r"Execution Time: ([\d.]+)", t)]
        res[s]["period"] += [float(x) for x in re.findall(r"period_counters_insert on usage_logs: time=([\d.]+)", t)]
        res[s]["billing"] += [float(x) for x in re.findall(r"billing_counters_insert on usage_logs: time=([\d.]+)", t)]
        res[s]["wal"] += [int(x) for x in re.findall(r"WAL: records=\d+(?: fpi=\d+)? bytes=(\d+)", t)]
    for s in "ABN":
        psql(dbs[s], "-c", "TRUNCATE usage_logs", input=None)
        psql(dbs[s], input=script(s, sql, 1, explain=False))
        row = psql(dbs[s], "-tAc", "SELECT avg(pg_column_size(u.*))::int, pg_relation_size('usage_logs_legacy') / 8192 FROM usage_logs u").split("|")
        r = res[s]
        print(f"{s}: insert of {N} logs min {min(r['exec']):.2f} ms (median {sorted(r['exec'])[len(r['exec']) // 2]:.2f}); "
              f"period_counters trigger min {min(r['period']):.2f} ms, billing_counters {min(r['billing']):.2f} ms; "
              f"WAL {min(r['wal']) / N:.0f} B a log; row {row[0]} B, {row[1].strip()} heap pages a {N} logs")
    for db in dbs.values():
        psql("postgres", "-c", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


if __name__ == "__main__":
    main()
