#!/usr/bin/env python3
"""Where the per-model catalog's batches spend their time (issue 24).

The same batches as bench/meters.sh (1,000 events of gpt-4o with 800 cache
reads, 8 clients, 100 tenants) on two databases of one server: A with the
two default meters, B with the three per-model meters. Windows of SECS
seconds run A B B A (ROUNDS times); each window reads, before and after:

  * the CPU of `serve` (/proc), of the database's backends and of the
    whole server's processes (every child of the postmaster: WAL writer,
    checkpointer, ...; meaningful on a server of its own);
  * WAL bytes (pg_stat_wal and the WAL position: the server's, so again a
    server of its own);
  * pg_stat_statements of the database, per statement: calls, execution
    time, rows, WAL bytes, buffers (when the extension is loaded);
  * every 50 ms, the database's active backends' wait events.

It prints each figure per ingested event, per window and as A/B means.
PERF=1 also records `perf record -g` of serve B and A during their first
windows into $OUT/perf.{A,B}.data.

  DATABASE_URL   the server (default: a scratch one on 127.0.0.1:55432)
  SECS ROUNDS    window length (8) and rounds of A B B A (1)
  PROBE_DB       database name prefix (mprobe)
  OLD_BIN        a second overage binary (an older tree): its A and B run
                 beside this tree's, oA oB B A A B oB oA, for the ratio of
                 each tree in one run
"""
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse as up
from collections import Counter, defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)
SERVER = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:55432/postgres?sslmode=disable")
SECS = int(os.environ.get("SECS", "8"))
ROUNDS = int(os.environ.get("ROUNDS", "1"))
PREFIX = os.environ.get("PROBE_DB", "mprobe")
OUT = os.environ.get("OUT", "/tmp/" + PREFIX)
ADDR = {"A": os.environ.get("ADDR_A", "127.0.0.1:18282"), "B": os.environ.get("ADDR_B", "127.0.0.1:18283")}
CLK = os.sysconf("SC_CLK_TCK")
os.makedirs(OUT, exist_ok=True)


def url(db):
    p = up.urlparse(SERVER)
    return p._replace(path="/" + db).geturl()


def psql(u, sql, *args):
    r = subprocess.run(["psql", "-qtAX", "-F", "\t", u, "-c", sql, *args], capture_output=True, text=True, check=True)
    return [line.split("\t") for line in r.stdout.splitlines() if line]


def cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read().rsplit(")", 1)[1].split()
        return (int(s[11]) + int(s[12])) / CLK
    except (FileNotFoundError, ProcessLookupError):
        return 0.0


def children(ppid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    s = f.read().rsplit(")", 1)[1].split()
                if int(s[1]) == ppid:
                    out.append(int(d))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return out


OLD_BIN = os.environ.get("OLD_BIN")
SIDES = ["A", "B"] + (["oA", "oB"] if OLD_BIN else [])
DB = {k: f"{PREFIX}_{k.lower()}" for k in SIDES}
ADDR.update({"oA": os.environ.get("ADDR_OA", "127.0.0.1:18284"), "oB": os.environ.get("ADDR_OB", "127.0.0.1:18285")})
BIN = {"A": "./bin/overage", "B": "./bin/overage", "oA": OLD_BIN, "oB": OLD_BIN}
# The postmaster's pid, whose children are the whole server's processes.
postmaster = int(open(psql(url("postgres"), "SHOW data_directory")[0][0] + "/postmaster.pid").readline())
# pg_stat_statements, when the server loads it, read from the postgres
# database (where the extension is created) for the benchmark's ones.
has_pgss = bool(psql(url("postgres"), "SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'"))


def fresh(side):
    db = DB[side]
    psql(url("postgres"), f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    psql(url("postgres"), f"CREATE DATABASE {db}")
    subprocess.run(["./bin/overage", "migrate", "--database-url", url(db)], check=True, capture_output=True)
    subprocess.run(["psql", "-q", url(db), "-f", "bench/setup.sql"], check=True, capture_output=True)
    if side.endswith("B"):
        subprocess.run(["bash", "-c", f". bench/meters.lib.sh && create_meters '{url(db)}'"], check=True)


def snapshot(side, serve_pid):
    u = url(DB[side])
    pids = [int(r[0]) for r in psql(u, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
    s = {
        "t": time.time(),
        "serve": cpu(serve_pid),
        "backends": {p: cpu(p) for p in pids},
        "server": sum(cpu(p) for p in children(postmaster)),
        "wal": dict(zip(("records", "fpi", "bytes", "write", "sync"),
                        (float(x) for x in psql(u, "SELECT wal_records, wal_fpi, wal_bytes, wal_write, wal_sync FROM pg_stat_wal")[0]))),
        "logs": int(psql(u, "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'usage_logs'")[0][0] or 0),
        "stmts": {},
    }
    if has_pgss:
        for r in psql(url("postgres"), f"""SELECT queryid, calls, total_exec_time, rows, wal_bytes, shared_blks_hit + shared_blks_read + shared_blks_dirtied,
                left(regexp_replace(query, '\\s+', ' ', 'g'), 90)
            FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = '{DB[side]}')"""):
            s["stmts"][r[0]] = (int(r[1]), float(r[2]), int(r[3]), float(r[4]), int(r[5]), r[6])
    return s


def waits(side, stop, out):
    u = url(DB[side])
    sql = """SELECT coalesce(wait_event_type, 'CPU') || ':' || coalesce(wait_event, '-') || ' ' || left(regexp_replace(query, '\\s+', ' ', 'g'), 40)
        FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()"""
    # One psql reading the samples from its stdin: a sample costs a query,
    # not a process.
    p = subprocess.Popen(["psql", "-qtAX", u], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    n = 0
    while not stop.is_set():
        p.stdin.write(sql + ";\n\\echo --\n")
        p.stdin.flush()
        for line in p.stdout:
            line = line.rstrip("\n")
            if line == "--":
                break
            if line:
                out[line] += 1
        n += 1
        time.sleep(0.05)
    p.stdin.close()
    p.wait()
    out["_samples"] = n


def window(side, serve_pid, perf):
    s0 = snapshot(side, serve_pid)
    stop, w = threading.Event(), Counter()
    th = threading.Thread(target=waits, args=(side, stop, w))
    th.start()
    pp = None
    if perf:
        pp = subprocess.Popen(["perf", "record", "-F", "499", "-g", "-p", str(serve_pid), "-o", f"{OUT}/perf.{side}.data"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = subprocess.run(["./bin/ingestload", "-url", "http://" + ADDR[side], "-duration", f"{SECS}s", "-clients", "8", "-tenants", "100",
                        "-batch", "1000", "-model", "gpt-4o", "-cache-read", "800"], capture_output=True, text=True)
    if pp:
        pp.send_signal(2)
        pp.wait()
    stop.set()
    th.join()
    s1 = snapshot(side, serve_pid)
    res = json.loads(r.stdout)
    ev = s1["logs"] - s0["logs"] or res["events"]
    back = sum(c - s0["backends"].get(p, 0.0) for p, c in s1["backends"].items())
    out = {
        "side": side, "events_per_s": res["events_per_s"], "events": ev, "p99_ms": res["p99_ms"], "errors": res["errors"],
        "serve_us": (s1["serve"] - s0["serve"]) * 1e6 / ev,
        "backends_us": back * 1e6 / ev,
        "server_us": (s1["server"] - s0["server"]) * 1e6 / ev,
        "wal_bytes": (s1["wal"]["bytes"] - s0["wal"]["bytes"]) / ev,
        "wal_records": (s1["wal"]["records"] - s0["wal"]["records"]) / ev,
        "wal_fpi": (s1["wal"]["fpi"] - s0["wal"]["fpi"]) / ev,
        "load": os.getloadavg()[0],
        "waits": {k: v for k, v in w.items()},
        "stmts": {},
    }
    for q, v1 in s1["stmts"].items():
        v0 = s0["stmts"].get(q, (0, 0.0, 0, 0.0, 0, v1[5]))
        if v1[0] - v0[0] > 0:
            out["stmts"][v1[5]] = {"calls": v1[0] - v0[0], "ms": v1[1] - v0[1], "rows": v1[2] - v0[2], "wal": v1[3] - v0[3], "blks": v1[4] - v0[4]}
    return out


def main():
    subprocess.run(["go", "build", "-o", "bin/ingestload", "./bench/ingestload"], check=True)
    if not os.environ.get("NO_BUILD"):
        subprocess.run(["go", "build", "-o", "bin/overage", "./cmd/overage"], check=True)
    for side in SIDES:
        fresh(side)
    serves = {}
    for side in SIDES:
        env = dict(os.environ, LOG_LEVEL="warn", DATABASE_URL=url(DB[side]), LISTEN_ADDR=ADDR[side])
        serves[side] = subprocess.Popen([BIN[side], "serve"], env=env)
    try:
        for side in SIDES:
            for _ in range(100):
                if subprocess.run(["curl", "-fs", f"http://{ADDR[side]}/readyz"], capture_output=True).returncode == 0:
                    break
                time.sleep(0.1)
            # Warm: plans, pools, the catalog cache.
            subprocess.run(["./bin/ingestload", "-url", "http://" + ADDR[side], "-duration", "3s", "-clients", "8", "-tenants", "100",
                            "-batch", "1000", "-model", "gpt-4o", "-cache-read", "800"], capture_output=True)
        runs = []
        perf = bool(os.environ.get("PERF"))
        done = set()
        order = ["oA", "oB", "B", "A", "A", "B", "oB", "oA"] if OLD_BIN else list("ABBA")
        for _ in range(ROUNDS):
            for side in order:
                runs.append(window(side, serves[side].pid, perf and side not in done))
                done.add(side)
        json.dump(runs, open(f"{OUT}/runs.json", "w"), indent=1)
        report(runs)
    finally:
        for p in serves.values():
            p.terminate()
            p.wait()
        for side in SIDES:
            psql(url("postgres"), f"DROP DATABASE IF EXISTS {DB[side]} WITH (FORCE)")


def report(runs):
    keys = ("events_per_s", "serve_us", "backends_us", "server_us", "wal_bytes", "wal_records", "wal_fpi")
    sides = [k for k in SIDES if any(r["side"] == k for r in runs)]
    print(f"# windows of {SECS} s, {' '.join(r['side'] for r in runs[:len(runs) // ROUNDS])} x {ROUNDS}; per ingested event")
    print("side " + " ".join(f"{k:>12}" for k in keys) + "   load")
    for r in runs:
        print(f"{r['side']:>4} " + " ".join(f"{r[k]:12.2f}" for k in keys) + f"   {r['load']:.1f}")
    mean = {s: {k: sum(r[k] for r in runs if r["side"] == s) / sum(1 for r in runs if r["side"] == s) for k in keys} for s in sides}
    for s in sides:
        print(f"{s + ' mean':>7} " + " ".join(f"{mean[s][k]:12.2f}" for k in keys))
    for a, b in (("A", "B"), ("oA", "oB")):
        if a in mean and b in mean:
            print(f"{b + '/' + a:>7} " + " ".join(f"{mean[b][k] / mean[a][k] if mean[a][k] else 0:12.2f}" for k in keys))
    # Statements: per event, mean of each side.
    st = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    n = Counter(r["side"] for r in runs)
    for r in runs:
        for q, v in r["stmts"].items():
            for k, x in v.items():
                st[q][r["side"]][k] += x / r["events"] / n[r["side"]]
    if st:
        print("\n# statements: exec µs / WAL bytes / buffers per event, " + " ".join(sides))
        for q in sorted(st, key=lambda q: -sum(st[q][s]["ms"] for s in sides)):
            if sum(st[q][s]["ms"] for s in sides) < 0.0004:
                continue
            print(" ".join(f"{st[q][s]['ms'] * 1e3:7.2f}" for s in sides) + " µs | " + " ".join(f"{st[q][s]['wal']:5.0f}" for s in sides) + f" B | {q}")
    print("\n# wait events of active backends (mean backends in each), " + " ".join(sides))
    w = {s: Counter() for s in sides}
    ns = Counter()
    for r in runs:
        ns[r["side"]] += r["waits"].get("_samples", 0)
        for k, v in r["waits"].items():
            if k != "_samples":
                w[r["side"]][k] += v
    allk = set().union(*w.values())
    for k in sorted(allk, key=lambda k: -sum(w[s][k] for s in sides))[:20]:
        print(" ".join(f"{w[s][k] / max(1, ns[s]):6.2f}" for s in sides) + f"  {k}")


if __name__ == "__main__":
    main()
