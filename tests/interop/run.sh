#!/usr/bin/env bash
# Cross-language interop test: runs tests/interop/client.py (Python grpcio) against the
# release binary of the Rust daemon.
#
#   tests/interop/run.sh            # from anywhere; the repo root is found from this file
#
# Environment:
#   INTEROP_VENV    virtualenv to use/create (default target/interop-venv, relative to the
#                   repo root unless absolute)
#   PYTHON          interpreter that creates the venv (default python3)
#   TOOLROUTER_BIN  daemon binary (default <repo>/target/release/toolrouter); build it first
#                   with `cargo build --release`
#   INTEROP_KEEP=1  keep the temp dir (stubs, database, daemon log)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"

venv="${INTEROP_VENV:-target/interop-venv}"
case "$venv" in
  /*) ;;
  *) venv="$repo/$venv" ;;
esac
req="$here/requirements.txt"
stamp="$venv/.requirements.stamp"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "interop: creating virtualenv $venv" >&2
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv --clear "$venv"
fi
vpy="$venv/bin/python"

# Install only when the requirements (or the venv's Python) changed since the last install.
want="$("$vpy" - "$req" <<'PY'
import hashlib, sys
h = hashlib.sha256(open(sys.argv[1], "rb").read())
h.update(sys.version.encode())
print(h.hexdigest())
PY
)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "interop: installing $req into $venv" >&2
  rm -f "$stamp"
  "$vpy" -m pip install --quiet --disable-pip-version-check -r "$req"
  printf '%s\n' "$want" >"$stamp"
fi

exec "$vpy" "$here/client.py" "$@"
