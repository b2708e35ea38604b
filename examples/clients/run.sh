#!/usr/bin/env bash
# Runs the example clients against the release daemon: starts it on a free loopback port
# with a temp database, configures a group the way a settings UI would, runs each example
# with the interop virtualenv's Python (grpcio), and stops the daemon.
#
#   cargo build --release && examples/clients/run.sh
#
# Environment: INTEROP_VENV (default target/interop-venv; created by tests/interop/run.sh),
# TOOLROUTER_BIN (default target/release/toolrouter).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${INTEROP_VENV:-$repo/target/interop-venv}"
bin="${TOOLROUTER_BIN:-$repo/target/release/toolrouter}"
py="$venv/bin/python"
[ -x "$py" ] || { echo "no virtualenv at $venv: run tests/interop/run.sh first" >&2; exit 1; }
tmp=$(mktemp -d)
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
addr="127.0.0.1:$port"
env -u TOOLROUTER_MANIFESTS "$bin" serve --listen "$addr" --database "sqlite://$tmp/toolrouter.db" \
  2>"$tmp/daemon.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
until "$bin" health --addr "$addr" >/dev/null 2>&1; do
  kill -0 $pid 2>/dev/null || { cat "$tmp/daemon.log" >&2; exit 1; }
  sleep 0.05
done
"$bin" settings set --addr "$addr" qbittorrent_url http://nas:8080 >/dev/null
"$bin" settings set --addr "$addr" sonarr_url http://nas:8989 >/dev/null
passed=0
# The address both ways the CLI takes it: host:port, and as a URL.
for run in "chat_backend $addr" "mcp_tools_list http://$addr"; do
  read -r example at <<< "$run"
  TOOLROUTER_ADDR="$at" "$py" "$here/$example.py"
  passed=$((passed + 1))
done
echo "$passed passed, 0 failed"
