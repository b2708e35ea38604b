#!/usr/bin/env bash
# Several replicas: Route and LoadToolGroup throughput of the release daemon on SQLite, on one
# PostgreSQL database with 1 replica, and on one PostgreSQL database with 3 replicas, in the
# same run (demo workload, every domain active). Each configuration gets a fresh database and
# fresh daemons; the load generator (`toolrouter bench grpc`) runs one process per replica,
# splitting the concurrency between them, and the figures are summed (req/s) or the worst
# generator's (latency). Nothing is pinned: the daemons, PostgreSQL and the generators share
# the machine's cores, as replicas on one host would. The three configurations take turns for
# several rounds, so drift on a shared machine hits each alike; medians are reported.
#
#   TOOLROUTER_TEST_POSTGRES_DURABLE=1 .ci/postgres.sh benches/replicas.sh [duration=10s] [concurrency=15] [rounds=3]
#
# (DURABLE keeps the cluster's fsync on, so PostgreSQL commits are as durable as SQLite's
# `synchronous = FULL`; the test cluster turns it off by default.)
#
# Mixes: route (Route, no conversation), converse (Route within conversations: on
# PostgreSQL each turn checks the conversation's version), load (LoadToolGroup into a new
# conversation: each call writes).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${TOOLROUTER_TEST_POSTGRES_URL:?run it as .ci/postgres.sh benches/replicas.sh (it needs a PostgreSQL server)}"
duration=${1:-10s}
concurrency=${2:-15}
rounds=${3:-3}

cargo build --release --quiet
bin=target/release/toolrouter
tools=target/release/toolrouter-bench
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# A fresh PostgreSQL database on the server the URL names, by URL.
pg_database() {
  local name="toolrouter_bench_$$_$1"
  psql -q "$TOOLROUTER_TEST_POSTGRES_URL" -c "CREATE DATABASE $name" >/dev/null
  local base=${TOOLROUTER_TEST_POSTGRES_URL%%\?*} query=
  [[ "$TOOLROUTER_TEST_POSTGRES_URL" == *\?* ]] && query="?${TOOLROUTER_TEST_POSTGRES_URL#*\?}"
  echo "${base%/*}/$name$query"
}

# Starts a daemon on $1 and appends its address to `addrs`.
start_daemon() {
  local log="$work/daemon-${#pids[@]}.log" addr=
  "$bin" serve --listen 127.0.0.1:0 --database "$1" --log-format json >/dev/null 2>"$log" &
  pids+=($!)
  for _ in $(seq 300); do
    addr=$(sed -n 's/.*"message":"serving".*"addr":"\([0-9.:]*\)".*/\1/p' "$log" | head -1)
    [ -n "$addr" ] && { addrs+=("$addr"); return; }
    sleep 0.1
  done
  cat "$log" >&2
  echo "replicas.sh: a daemon did not start" >&2
  exit 1
}

stop_daemons() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}

# measure LABEL MIX ADDR...: one generator per address, the concurrency split between them.
measure() {
  local label=$1 mix=$2
  shift 2
  local n=$# per=$(( (concurrency + $# - 1) / $# )) i=0 gens=()
  for addr in "$@"; do
    "$bin" bench grpc --addr "http://$addr" --mix "$mix" --concurrency "$per" --duration "$duration" \
      --messages "$work/demo/messages.jsonl" >"$work/out-$i" 2>&1 &
    gens+=($!)
    i=$((i + 1))
  done
  for g in "${gens[@]}"; do wait "$g" || { cat "$work"/out-*; echo "replicas.sh: a generator failed" >&2; exit 1; }; done
  python3 - "$label" "$mix" "$n" "$per" "$work"/out-* >>"$work/results" <<'PY'
import json, sys
label, mix, n, per, files = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
runs = [json.loads(open(f).read().strip().splitlines()[-1]) for f in files]
print(json.dumps({"label": label, "mix": mix, "shape": f"{n} x {per}",
                  "rps": sum(r["requests_per_sec"] for r in runs),
                  "p50": max(r["p50_us"] for r in runs), "p99": max(r["p99_us"] for r in runs),
                  "errors": sum(r["errors"] for r in runs)}))
PY
  tail -n 1 "$work/results" >&2
  rm -f "$work"/out-*
}

"$tools" export demo --out "$work/demo" >/dev/null

# run LABEL DATABASE REPLICAS: every mix against fresh daemons on a database whose settings
# activate every domain.
run() {
  addrs=()
  rm -rf "$work/settings-export"
  "$tools" export demo --out "$work/settings-export" --database "$2" >/dev/null
  for _ in $(seq "$3"); do start_daemon "$2"; done
  for mix in route converse load; do measure "$1" "$mix" "${addrs[@]}"; done
  stop_daemons
}

for round in $(seq "$rounds"); do
  run "SQLite, 1 daemon" "sqlite://$work/sqlite-$round.db" 1
  run "PostgreSQL, 1 replica" "$(pg_database "one_$round")" 1
  run "PostgreSQL, 3 replicas" "$(pg_database "three_$round")" 3
done
python3 - "$work/results" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows.setdefault((r["label"], r["mix"], r["shape"]), []).append(r)
print("| database | mix | generators x concurrency | req/s (median) | p50 / p99, worst generator (median) | errors |")
print("|---|---|---|---|---|---|")
for (label, mix, shape), rs in rows.items():
    med = lambda k: statistics.median(r[k] for r in rs)
    print(f"| {label} | {mix} | {shape} | {med('rps'):,.0f} | {med('p50'):,.0f} / {med('p99'):,.0f} µs | {sum(r['errors'] for r in rs)} |")
PY
