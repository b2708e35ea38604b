#!/usr/bin/env bash
# Idle clocks to flush: starts the daemon (the demo registry, sonarr configured) on loopback
# over a fresh SQLite file, or the empty PostgreSQL database given, makes N conversations
# whose clocks are due (examples/upkeep.rs), then stops it with SIGTERM and prints how long
# the shutdown took: the final upkeep writes those N clocks.
#
#   benches/upkeep.sh [N=20000] [DATABASE_URL]     (TOOLROUTER_BIN: another build to time)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20000}
cargo build --release --quiet --bin toolrouter --example upkeep
bin=${TOOLROUTER_BIN:-target/release/toolrouter}
work=$(mktemp -d)
url=${2:-sqlite://$work/t.db}
"$bin" serve --listen 127.0.0.1:0 --database "$url" --log-format json 2>"$work/log" &
pid=$!
for _ in $(seq 100); do addr=$(sed -n 's/.*"message":"serving".*"addr":"\([0-9.:]*\)".*/\1/p' "$work/log" | head -1); [ -n "$addr" ] && break; sleep 0.1; done
target/release/toolrouter settings --addr "http://$addr" --database "$url" set sonarr_url x >/dev/null
target/release/examples/upkeep "http://$addr" sonarr "$n"
start=$(date +%s%N)
kill -TERM "$pid"; wait "$pid" || true
echo "shutdown, the last upkeep included: $(( ($(date +%s%N) - start) / 1000000 )) ms ($bin)"
rm -rf "$work"
