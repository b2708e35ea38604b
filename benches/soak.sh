#!/usr/bin/env bash
# The soak run: the release daemon on loopback serves the mixed workload (mostly Route, plus
# LoadToolGroup, ListGroups, InvalidateSettings, ReloadRegistry, and UpsertDomain/DeleteDomain
# of a run-time domain per worker, which the registry is rebuilt and stored for) from
# `toolrouter bench grpc --mix mixed` over the demo messages while a second process
# (`toolrouter-bench flip-settings`) flips settings in its database and a third
# (`toolrouter-bench watch`) holds WatchRegistry streams open, reading slowly, until the daemon
# stops. Fails on any unexpected error: from a call, from a settings write, from a watcher, in
# the daemon's log, or at shutdown; and if a run-time domain of the mix is left behind.
#
#   benches/soak.sh [duration=60s] [concurrency=8]
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-60s}
concurrency=${2:-8}

cargo build --release --quiet
bin=target/release/toolrouter
tools=target/release/toolrouter-bench
work=$(mktemp -d)
daemon=
flipper=
watcher=
cleanup() {
  [ -n "$flipper" ] && kill "$flipper" 2>/dev/null || true
  [ -n "$watcher" ] && kill "$watcher" 2>/dev/null || true
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
db="sqlite://$work/toolrouter.db"
"$tools" export demo --out "$work/demo" >/dev/null

"$bin" serve --listen 127.0.0.1:0 --database "$db" --settings-ttl 100ms --log-format json \
  2>"$work/daemon.log" &
daemon=$!
addr=
for _ in $(seq 300); do
  addr=$(sed -n 's/.*"message":"serving".*"addr":"\([0-9.:]*\)".*/\1/p' "$work/daemon.log" | head -1)
  [ -n "$addr" ] && break
  kill -0 "$daemon" 2>/dev/null || { cat "$work/daemon.log"; echo "soak: the daemon did not start"; exit 1; }
  sleep 0.1
done
[ -n "$addr" ] || { cat "$work/daemon.log"; echo "soak: no serving line"; exit 1; }

"$tools" flip-settings --database "$db" --duration "$duration" --every 10ms >"$work/flip.out" 2>&1 &
flipper=$!
"$tools" watch --addr "http://$addr" --streams 4 --pause 20ms >"$work/watch.out" 2>&1 &
watcher=$!

status=0
"$bin" bench grpc --addr "http://$addr" --mix mixed --concurrency "$concurrency" \
  --duration "$duration" --messages "$work/demo/messages.jsonl" | tee "$work/soak.out" || status=1
# The run-time domains the mix registers are deleted again by the time it ends.
left=$("$bin" groups --addr "http://$addr" | grep -c '^bench-worker-' || true)
if [ "$left" != 0 ]; then
  echo "soak: $left run-time domains left behind"
  status=1
fi

wait "$flipper" || { echo "soak: settings writes failed"; status=1; }
flipper=
cat "$work/flip.out"

kill -TERM "$daemon"
if ! wait "$daemon"; then
  echo "soak: the daemon did not exit 0 on SIGTERM"
  status=1
fi
daemon=
wait "$watcher" || { echo "soak: a watcher failed"; status=1; }
watcher=
cat "$work/watch.out"
errors=$(grep -c '"level":"ERROR"' "$work/daemon.log" || true)
if [ "$errors" != 0 ]; then
  grep '"level":"ERROR"' "$work/daemon.log" | head -20
  echo "soak: $errors error lines in the daemon's log"
  status=1
fi
[ "$status" = 0 ] && echo "soak: ok ($duration, concurrency $concurrency, no unexpected errors)"
exit "$status"
