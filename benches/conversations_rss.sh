#!/usr/bin/env bash
# Memory of the conversation cache: starts the release daemon on loopback over a fresh
# database, sends one Route in each of N new conversations (examples/conversations_rss.rs)
# and prints its resident memory before and after. Extra arguments go to `serve`.
#
#   benches/conversations_rss.sh [N=200000] [ID_BYTES=16] [serve flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200000}; idb=${2:-16}; shift $(( $# < 2 ? $# : 2 ))
cargo build --release --quiet --bin toolrouter --example conversations_rss
bin=target/release/toolrouter
work=$(mktemp -d)
"$bin" serve --listen 127.0.0.1:0 --database "sqlite://$work/t.db" --log-format json "$@" 2>"$work/log" &
pid=$!
for _ in $(seq 100); do addr=$(sed -n 's/.*"message":"serving".*"addr":"\([0-9.:]*\)".*/\1/p' "$work/log" | head -1); [ -n "$addr" ] && break; sleep 0.1; done
target/release/examples/conversations_rss "$pid" "http://$addr" "$n" "$idb"
kill -TERM "$pid"; wait "$pid" || true
rm -rf "$work"
