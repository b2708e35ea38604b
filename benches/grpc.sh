#!/usr/bin/env bash
# gRPC benchmark: the daemon against the transport floor (the baseline server, which sends
# the daemon's own answers prebuilt, without routing). Both servers are pinned to core 0 and
# the load generator to core 1. Load alternates between the two servers for several rounds
# at concurrency 1 and 16, so drift on a shared machine hits both alike; medians are
# reported. Then the daemon's start-up time (process start to health SERVING) and peak RSS.
#
# Usage: [FORMAT=F] [DAEMON_FLAGS='...'] [DAEMON_BIN=path] benches/grpc.sh [workload] [duration] [rounds]
#   workload: demo (default), seal or scale-N; duration per run (default 10s); rounds (3)
#   FORMAT: ask Route for tools_json in this format (openai_chat, ...; default: native)
#   DAEMON_FLAGS: flags for both servers' routing, e.g. '--search off --max-tools 0'
#   BASELINE_FLAGS: the floor's flags when they must differ (default: DAEMON_FLAGS)
#   DAEMON_BIN: another daemon binary to measure (e.g. an older build) against the same floor
set -euo pipefail
cd "$(dirname "$0")/.."
workload=${1:-demo}
duration=${2:-10s}
rounds=${3:-3}
bin=target/release/toolrouter
tools=target/release/toolrouter-bench
cargo build --release --quiet
daemon_bin=${DAEMON_BIN:-$bin}
read -r -a extra <<< "${DAEMON_FLAGS:-}"
read -r -a baseline_extra <<< "${BASELINE_FLAGS:-${DAEMON_FLAGS:-}}"
format=(); [ -n "${FORMAT:-}" ] && format=(--format "$FORMAT")
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
"$tools" export "$workload" --out "$tmp" --eval "${TOOLROUTER_EVAL_DIR:-../shared/eval}" >&2
if [ "$workload" = demo ]; then manifests=(); else manifests=(--manifests "$tmp/manifests"); fi
flags=(--database "sqlite://$tmp/toolrouter.db" "${manifests[@]}" --log-format json)

wait_ready() { # port start_ns -> prints milliseconds from start until health is SERVING
  until "$bin" health --addr "http://127.0.0.1:$1" >/dev/null 2>&1; do sleep 0.002; done
  echo $(( ($(date +%s%N) - $2) / 1000000 ))
}

daemon_port=$((50100 + RANDOM % 500))
baseline_port=$((daemon_port + 500))
start=$(date +%s%N)
taskset -c 0 "$daemon_bin" serve --listen "127.0.0.1:$daemon_port" "${flags[@]}" "${extra[@]}" 2>"$tmp/daemon.log" &
daemon_pid=$!
ready_ms=$(wait_ready $daemon_port "$start")
taskset -c 0 "$tools" baseline-server --listen "127.0.0.1:$baseline_port" "${flags[@]}" "${baseline_extra[@]}" \
  --messages "$tmp/messages.jsonl" 2>"$tmp/baseline.log" &
baseline_pid=$!
wait_ready $baseline_port "$(date +%s%N)" >/dev/null

for round in $(seq "$rounds"); do
  for c in 1 16; do
    for server in daemon baseline; do
      port=$daemon_port; [ $server = baseline ] && port=$baseline_port
      line=$(taskset -c 1 "$bin" bench grpc --addr "http://127.0.0.1:$port" --duration "$duration" \
        --concurrency "$c" --messages "$tmp/messages.jsonl" "${format[@]}" | tail -n 1)
      echo "round $round $server concurrency $c: $line"
      echo "$server $c $line" >> "$tmp/results"
    done
  done
done
echo "daemon: ready in ${ready_ms} ms; peak RSS $(awk '/VmHWM/ {print $2, $3}' /proc/$daemon_pid/status)"
kill -TERM $daemon_pid $baseline_pid
wait $daemon_pid $baseline_pid || true
python3 - "$tmp/results" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    server, c, js = line.split(" ", 2)
    runs.setdefault((server, int(c)), []).append(json.loads(js))
for c in (1, 16):
    d, b = runs[("daemon", c)], runs[("baseline", c)]
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    dr, br = med(d, "requests_per_sec"), med(b, "requests_per_sec")
    errors = sum(r["errors"] for r in d + b)
    print(f"concurrency {c}: daemon {dr:.0f} req/s (p50 {med(d, 'p50_us'):.0f} us, p99 {med(d, 'p99_us'):.0f} us), "
          f"baseline {br:.0f} req/s (p50 {med(b, 'p50_us'):.0f} us, p99 {med(b, 'p99_us'):.0f} us), "
          f"ratio {dr / br:.3f}, errors {errors}")
PY
