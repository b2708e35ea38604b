#!/usr/bin/env bash
# Runs a command beside a throwaway PostgreSQL cluster, for the tests that need one:
#
#   .ci/postgres.sh cargo test
#
# Finds initdb and pg_ctl (on PATH, else Debian's /usr/lib/postgresql/NN/bin, else installs
# Debian's `postgresql` package with apt-get), creates a cluster in a temp folder as an
# unprivileged user (PostgreSQL refuses to run as root: as root the cluster belongs to
# `nobody`), starts it on a free loopback port without fsync (the data is thrown away; with
# TOOLROUTER_TEST_POSTGRES_DURABLE=1 fsync stays on, for benchmarks), and runs the command with
#
#   TOOLROUTER_TEST_POSTGRES_URL   postgres://toolrouter@127.0.0.1:PORT/postgres?sslmode=disable
#                                  (trust auth; each test creates its own database from it)
#   TOOLROUTER_TEST_POSTGRES_DATA  the cluster's data folder
#   TOOLROUTER_TEST_POSTGRES_CTL   pg_ctl for that cluster, run as its owner (`stop`, `start`)
#   TOOLROUTER_TEST_POSTGRES_CA    the CA that signed the cluster's TLS certificate (for
#                                  127.0.0.1), for the tests that connect with TLS
#
# The cluster is stopped and removed when the command ends, however it ends; the script exits
# with the command's status.
set -euo pipefail

if [ "$#" -eq 0 ]; then
  echo "usage: $0 COMMAND [ARGS...]" >&2
  exit 2
fi

find_bin() {
  local dir
  if command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
    dirname "$(readlink -f "$(command -v pg_ctl)")"
    return
  fi
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$dir/pg_ctl" ] && [ -x "$dir/initdb" ]; then
      echo "$dir"
      return
    fi
  done
  return 1
}

if ! bin=$(find_bin); then
  echo "== installing PostgreSQL (Debian's postgresql package)" >&2
  sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  "${sudo[@]}" apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq postgresql >&2
  bin=$(find_bin) || { echo "postgres.sh: no initdb/pg_ctl after installing postgresql" >&2; exit 1; }
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/toolrouter-pg.XXXXXX")
data="$work/data"
owner=$(id -un)
as_owner=()
if [ "$(id -u)" -eq 0 ]; then
  owner=nobody
  # runuser is in util-linux, in /usr/sbin, which a root PATH may leave out.
  runuser=$(PATH="$PATH:/usr/sbin:/sbin" command -v runuser) \
    || { echo "postgres.sh: runuser (util-linux) not found" >&2; exit 1; }
  as_owner=("$runuser" -u "$owner" --)
  chown "$owner" "$work"
fi

# A free loopback port: the kernel picks one, and PostgreSQL takes it right after.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

ctl="$work/pg_ctl"
cat >"$ctl" <<EOF
#!/usr/bin/env bash
# pg_ctl for the test cluster in $data, run as its owner.
exec ${as_owner[*]} "$bin/pg_ctl" -D "$data" -l "$work/postgres.log" "\$@"
EOF
chmod 755 "$ctl"

child=
stop() {
  [ -n "$child" ] && kill -TERM "$child" 2>/dev/null
  "$ctl" stop -m immediate >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap stop EXIT
# A signal ends the script through `exit` (passing it on to the command), so the EXIT trap
# stops the cluster then too.
trap 'exit 130' INT
trap 'exit 143' TERM

"${as_owner[@]}" "$bin/initdb" -D "$data" -U toolrouter --auth=trust -E UTF8 --no-sync >"$work/initdb.log" 2>&1 \
  || { cat "$work/initdb.log" >&2; exit 1; }
cat >>"$data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$work'
max_connections = 300
EOF
# The tests' data is thrown away: no need to wait for the disk, unless a benchmark asks.
if [ "${TOOLROUTER_TEST_POSTGRES_DURABLE:-}" != 1 ]; then
  printf 'fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n' >>"$data/postgresql.conf"
fi
# TLS for the tests that connect with it: a throwaway CA and a certificate for 127.0.0.1 it
# signed (the other tests connect with sslmode=disable, as before). openssl comes with
# Debian's postgresql packages (ssl-cert).
ca=
if command -v openssl >/dev/null; then
  tls="$work/tls"
  mkdir "$tls"
  openssl req -x509 -new -nodes -days 2 -subj "/CN=toolrouter test CA" \
    -keyout "$tls/ca.key" -out "$tls/ca.crt" >"$tls/log" 2>&1 \
  && openssl req -new -nodes -subj "/CN=127.0.0.1" -keyout "$data/server.key" -out "$tls/server.csr" >>"$tls/log" 2>&1 \
  && printf 'subjectAltName = IP:127.0.0.1\nbasicConstraints = CA:FALSE\n' >"$tls/ext" \
  && openssl x509 -req -days 2 -in "$tls/server.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -CAcreateserial \
    -extfile "$tls/ext" -out "$data/server.crt" >>"$tls/log" 2>&1 \
  || { cat "$tls/log" >&2; exit 1; }
  chown "$owner" "$data/server.key" "$data/server.crt"
  chmod 600 "$data/server.key"
  printf 'ssl = on\n' >>"$data/postgresql.conf"
  ca="$tls/ca.crt"
fi
"$ctl" start -w -t 60 >/dev/null || { cat "$work/postgres.log" >&2; exit 1; }
echo "== PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (data $data)" >&2

export TOOLROUTER_TEST_POSTGRES_URL="postgres://toolrouter@127.0.0.1:$port/postgres?sslmode=disable"
# The CA that signed the server's certificate (unset when the cluster has no TLS).
export TOOLROUTER_TEST_POSTGRES_CA="$ca"
export TOOLROUTER_TEST_POSTGRES_DATA="$data"
export TOOLROUTER_TEST_POSTGRES_CTL="$ctl"
# In the background, so a signal reaches the trap at once instead of after the command.
"$@" &
child=$!
status=0
wait "$child" || status=$?
child=
exit "$status"
