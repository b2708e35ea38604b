#!/usr/bin/env bash
# Start-up time (process start to health SERVING, polled every 2 ms) and resident memory
# (now, and the peak the registry build reached) of daemon binaries on one registry, alternating between them so drift hits all alike; the
# first binary given also reports its RSS once every provider format has been rendered.
#
# Usage: benches/startup.sh MANIFEST_DIR RUNS BIN [BIN...]
#   e.g. benches/startup.sh /tmp/seal/manifests 5 /tmp/main/toolrouter target/release/toolrouter
#   (export the seal manifests with `toolrouter-bench export seal --out /tmp/seal`)
# Each daemon runs with --search off; DAEMON_FLAGS adds flags to all of them.
set -euo pipefail
manifests=$1; runs=$2; shift 2
read -r -a extra <<< "${DAEMON_FLAGS:-}"
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
for i in $(seq "$runs"); do
  for bin in "$@"; do
    # Below the ephemeral range (32768-60999), where a client socket may hold the port.
    port=$((22000 + RANDOM % 2000))
    start=$(date +%s%N)
    "$bin" serve --listen "127.0.0.1:$port" --database "sqlite://$tmp/db-$i-$port" \
      --manifests "$manifests" --search off "${extra[@]}" 2>"$tmp/log" &
    pid=$!
    until "$bin" health --addr "127.0.0.1:$port" >/dev/null 2>&1; do
      if ! kill -0 "$pid" 2>/dev/null; then echo "$bin exited:" >&2; tail -n 3 "$tmp/log" >&2; exit 1; fi
      sleep 0.002
    done
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    line="$bin: ready in $ms ms, RSS $(awk '/VmRSS/ {print $2}' "/proc/$pid/status") kB (peak while starting $(awk '/VmHWM/ {print $2}' "/proc/$pid/status") kB)"
    if [ "$i" = 1 ] && [ "$bin" = "$1" ] && "$bin" route --help | grep -q -- --format; then
      for f in openai_chat openai_responses anthropic gemini mcp; do
        "$bin" route --addr "127.0.0.1:$port" --format "$f" thanks >/dev/null
      done
      line="$line, $(awk '/VmRSS/ {print $2}' "/proc/$pid/status") kB with every format rendered"
    fi
    echo "$line"
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
