#!/usr/bin/env bash
# gRPC benchmark: the daemon against the transport floor (the baseline server), each pinned
# to core 0 with the load generator on core 1, at concurrency 1 and 16; then start-up time
# and peak RSS of the daemon. Usage: benches/grpc.sh [workload] [duration]
#   workload: demo (default), seal or scale-N; duration: e.g. 10s (default)
set -euo pipefail
cd "$(dirname "$0")/.."
workload=${1:-demo}
duration=${2:-10s}
bin=target/release/toolrouter
cargo build --release --quiet
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
"$bin" bench export "$workload" --out "$tmp" --eval "${TOOLROUTER_EVAL_DIR:-../shared/eval}" >&2
if [ "$workload" = demo ]; then manifests=(); else manifests=(--manifests "$tmp/manifests"); fi
flags=(--database "sqlite://$tmp/toolrouter.db" "${manifests[@]}" --log-format json)

wait_ready() { # port start_ns -> prints milliseconds from start until health is SERVING
  local start=$2
  until "$bin" health --addr "http://127.0.0.1:$1" >/dev/null 2>&1
  do sleep 0.005; done
  echo $(( ($(date +%s%N) - start) / 1000000 ))
}

run_load() { # port concurrency -> JSON line
  taskset -c 1 "$bin" bench grpc --addr "http://127.0.0.1:$1" --duration "$duration" \
    --concurrency "$2" --messages "$tmp/messages.jsonl" | tail -n 1
}

declare -A result
for server in daemon baseline; do
  port=$((50100 + RANDOM % 1000))
  start=$(date +%s%N)
  if [ $server = daemon ]; then
    taskset -c 0 "$bin" serve --listen "127.0.0.1:$port" "${flags[@]}" 2>"$tmp/$server.log" &
  else
    taskset -c 0 "$bin" bench baseline-server --listen "127.0.0.1:$port" "${flags[@]}" \
      --messages "$tmp/messages.jsonl" 2>"$tmp/$server.log" &
  fi
  pid=$!
  ready_ms=$(wait_ready $port $start)
  for c in 1 16; do
    result[$server-$c]=$(run_load $port $c)
    echo "$server concurrency $c: ${result[$server-$c]}"
  done
  if [ $server = daemon ]; then
    echo "daemon: ready in ${ready_ms} ms; peak RSS $(awk '/VmHWM/ {print $2, $3}' /proc/$pid/status)"
  fi
  kill -TERM $pid; wait $pid || true
done
for c in 1 16; do
  python3 - "${result[daemon-$c]}" "${result[baseline-$c]}" "$c" <<'PY'
import json, sys
d, b, c = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
print(f"concurrency {c}: daemon {d['requests_per_sec']:.0f} req/s, baseline {b['requests_per_sec']:.0f} req/s, "
      f"ratio {d['requests_per_sec'] / b['requests_per_sec']:.3f}, errors {d['errors']} / {b['errors']}")
PY
done
