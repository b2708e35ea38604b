#!/usr/bin/env bash
# gRPC benchmark: the daemon against the transport floor (the baseline server, which sends
# the daemon's own answers prebuilt, without routing). Both servers are pinned to core 0 and
# the load generator to core 1. Load alternates between the two servers for several rounds
# at concurrency 1 and 16 (every other round in reverse order), so drift on a shared machine
# hits both alike; medians are
# reported, with each server's CPU time per request (user + system, from /proc: time the
# hypervisor takes away from a shared VM does not count in it, so it holds up when the rates
# swing). Then the daemon's start-up time (process start to health SERVING), its peak RSS
# (and the part of it reached while starting, before any load) and its RSS after the load.
#
# Usage: [FORMAT=F] [DAEMON_FLAGS='...'] [DAEMON_BIN=path] benches/grpc.sh [workload] [duration] [rounds]
#   workload: demo (default), seal or scale-N; duration per run (default 10s); rounds (3)
#   FORMAT: ask Route for tools_json in this format (openai_chat, ...; default: native)
#   DECODE: how the load generator reads answers: count (default: walks each answer's fields
#     without building them, so the servers are measured, not the generator's decoding) or full
#   DAEMON_FLAGS: flags for both servers' routing, e.g. '--search off --max-tools 0'
#   BASELINE_FLAGS: the floor's flags when they must differ (default: DAEMON_FLAGS)
#   DAEMON_BIN: another daemon binary to measure (e.g. an older build) against the same floor
#   BEFORE_BIN: an earlier build measured too, in the same rounds, with BEFORE_FLAGS (default:
#     DAEMON_FLAGS); the report adds its rates and the daemon's ratio to them
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
read -r -a before_extra <<< "${BEFORE_FLAGS:-${DAEMON_FLAGS:-}}"
format=(); [ -n "${FORMAT:-}" ] && format=(--format "$FORMAT")
format+=(--decode "${DECODE:-count}")
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
"$tools" export "$workload" --out "$tmp" --eval "${TOOLROUTER_EVAL_DIR:-../shared/eval}" >&2
if [ "$workload" = demo ]; then manifests=(); else manifests=(--manifests "$tmp/manifests"); fi
flags=("${manifests[@]}" --log-format json)
own_db() { # name -> a database with the export's settings, for another build, which may not
  # open this build's database (a newer schema); its migrations create the rest
  python3 -c 'import sqlite3, sys
src = sqlite3.connect(sys.argv[1]); dst = sqlite3.connect(sys.argv[2])
dst.execute("CREATE TABLE settings (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL)")
dst.executemany("INSERT INTO settings VALUES (?, ?)", src.execute("SELECT key, value FROM settings"))
dst.commit()' "$tmp/toolrouter.db" "$tmp/$1.db"
  echo "$tmp/$1.db"
}
daemon_db=$tmp/toolrouter.db
[ -n "${DAEMON_BIN:-}" ] && daemon_db=$(own_db daemon)

wait_ready() { # port start_ns pid log -> prints milliseconds from start until health is SERVING
  until "$bin" health --addr "http://127.0.0.1:$1" >/dev/null 2>&1; do
    if ! kill -0 "$3" 2>/dev/null; then echo "the server on port $1 exited:" >&2; tail -n 5 "$4" >&2; exit 1; fi
    sleep 0.002
  done
  echo $(( ($(date +%s%N) - $2) / 1000000 ))
}

# Below the ephemeral range (32768-60999), where a client socket may hold the port.
daemon_port=$((20100 + RANDOM % 500))
baseline_port=$((daemon_port + 500))
start=$(date +%s%N)
taskset -c 0 "$daemon_bin" serve --listen "127.0.0.1:$daemon_port" --database "sqlite://$daemon_db" \
  "${flags[@]}" "${extra[@]}" 2>"$tmp/daemon.log" &
daemon_pid=$!
ready_ms=$(wait_ready $daemon_port "$start" $daemon_pid "$tmp/daemon.log")
status_kb() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$daemon_pid/status"; }
start_peak_kb=$(status_kb VmHWM)
taskset -c 0 "$tools" baseline-server --listen "127.0.0.1:$baseline_port" --database "sqlite://$tmp/toolrouter.db" \
  "${flags[@]}" "${baseline_extra[@]}" --messages "$tmp/messages.jsonl" 2>"$tmp/baseline.log" &
baseline_pid=$!
wait_ready $baseline_port "$(date +%s%N)" $baseline_pid "$tmp/baseline.log" >/dev/null
servers=(daemon baseline); ports=([0]=$daemon_port [1]=$baseline_port); pids=($daemon_pid $baseline_pid)
if [ -n "${BEFORE_BIN:-}" ]; then
  before_port=$((daemon_port + 1000))
  taskset -c 0 "$BEFORE_BIN" serve --listen "127.0.0.1:$before_port" --database "sqlite://$(own_db before)" \
    "${flags[@]}" "${before_extra[@]}" 2>"$tmp/before.log" &
  pids+=($!)
  wait_ready $before_port "$(date +%s%N)" $! "$tmp/before.log" >/dev/null
  servers+=(before); ports+=([2]=$before_port)
fi

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; } # user + system, in clock ticks
order=("${!servers[@]}")
for round in $(seq "$rounds"); do
  # Every other round in reverse order, so that drift during a round favours no server.
  if (( round % 2 == 0 )); then seq_=$(printf '%s\n' "${order[@]}" | tac); else seq_=${order[*]}; fi
  for c in 1 16; do
    for i in $seq_; do
      server=${servers[$i]}; port=${ports[$i]}
      cpu_before=$(cpu_ticks "${pids[$i]}")
      line=$(taskset -c 1 "$bin" bench grpc --addr "http://127.0.0.1:$port" --duration "$duration" \
        --concurrency "$c" --messages "$tmp/messages.jsonl" "${format[@]}" | tail -n 1)
      line="${line%\}},\"cpu_ticks\":$(( $(cpu_ticks "${pids[$i]}") - cpu_before ))}"
      echo "round $round $server concurrency $c: $line"
      echo "$server $c $round $line" >> "$tmp/results"
    done
  done
done
echo "daemon: ready in ${ready_ms} ms; peak RSS $(status_kb VmHWM) kB (while starting: $start_peak_kb kB), RSS after the load $(status_kb VmRSS) kB"
kill -TERM "${pids[@]}"
wait "${pids[@]}" || true
python3 - "$tmp/results" "$(getconf CLK_TCK)" <<'PY'
import json, statistics, sys
tick = 1e6 / int(sys.argv[2])
cpu = lambda r: r["cpu_ticks"] * tick / max(r["ok"], 1)  # µs of CPU per request
runs = {}
for line in open(sys.argv[1]):
    server, c, rnd, js = line.split(" ", 3)
    runs.setdefault((server, int(c)), []).append(json.loads(js))
for c in (1, 16):
    d, b = runs[("daemon", c)], runs[("baseline", c)]
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    dr, br = med(d, "requests_per_sec"), med(b, "requests_per_sec")
    errors = sum(r["errors"] for r in d + b)
    print(f"concurrency {c}: daemon {dr:.0f} req/s (p50 {med(d, 'p50_us'):.0f} us, p99 {med(d, 'p99_us'):.0f} us), "
          f"baseline {br:.0f} req/s (p50 {med(b, 'p50_us'):.0f} us, p99 {med(b, 'p99_us'):.0f} us), "
          f"ratio {dr / br:.3f} (median of the rounds' own ratios "
          f"{statistics.median(x['requests_per_sec'] / y['requests_per_sec'] for x, y in zip(d, b)):.3f}), errors {errors}")
    dc, bc = statistics.median(map(cpu, d)), statistics.median(map(cpu, b))
    print(f"concurrency {c}: CPU per request: daemon {dc:.0f} us, baseline {bc:.0f} us, "
          f"baseline / daemon {bc / dc:.3f}")
    if ("before", c) in runs:
        e = runs[("before", c)]
        er, ec = med(e, "requests_per_sec"), statistics.median(map(cpu, e))
        print(f"concurrency {c}: before {er:.0f} req/s (p50 {med(e, 'p50_us'):.0f} us), daemon / before {dr / er:.2f}, "
              f"errors {sum(r['errors'] for r in e)}; CPU per request before {ec:.0f} us, before / daemon {ec / dc:.3f}")
PY
