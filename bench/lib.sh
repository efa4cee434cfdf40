# Sourced by the bench scripts: what several of them need alike.

# PGHOST_URL: the server the benchmarks make their databases on.
PGHOST_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}

# db_url DB: PGHOST_URL (the server's URL) with its database replaced by DB.
db_url() { python3 -c "import sys,urllib.parse as u; p=u.urlparse(sys.argv[1]); print(p._replace(path='/'+sys.argv[2]).geturl())" "$PGHOST_URL" "$1"; }

# memory: the machine's free memory and page cache now. Once the page
# cache is full the kernel reclaims as the loads write, which a plain
# insert load with no product feels as much as the product does
# (docs/benchmarks.md, "The batch soak on huge pages").
memory() { awk '/^(MemFree|Cached):/ {printf "%s %d MB ", $1, $2 / 1024}' /proc/meminfo; echo; }
