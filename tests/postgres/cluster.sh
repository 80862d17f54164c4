#!/usr/bin/env bash
# A private PostgreSQL server for the tests that run the GPU database on PostgreSQL.
#
#   tests/postgres/cluster.sh start    # idempotent: leaves a server running, prints its URL
#   tests/postgres/cluster.sh url      # prints the URL; exit 1 if no server of this checkout runs
#   tests/postgres/cluster.sh env      # `export WORKBENCH_TEST_POSTGRES_URL=...` for eval
#   tests/postgres/cluster.sh status   # exit 0 if it answers
#   tests/postgres/cluster.sh stop
#
# Debian's own binaries (package postgresql: /usr/lib/postgresql/<version>/bin), never its system
# cluster: initdb makes a cluster in $WB_POSTGRES_DIR (default .cache/postgres in this checkout,
# git-ignored), pg_ctl starts it with `-p PORT -k SOCKETDIR` and no TCP listener at all. A Unix socket
# in a folder of this checkout cannot collide with another checkout's server or the system's 5432,
# and only this account (and root) can open it, which is why `trust` authentication is acceptable
# for a test server. PostgreSQL refuses to run as root: as root the cluster belongs to the `postgres`
# account (created by Debian's package), otherwise to whoever runs this script.
# The tests find the server through WORKBENCH_TEST_POSTGRES_URL (.ci/run exports it) or, when that is
# unset, by asking `cluster.sh url`, so a developer only has to start it once.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PORT=${WB_POSTGRES_PORT:-5439}
SUPERUSER=postgres

log() { echo "cluster.sh: $*" >&2; }

bindir() {
  # The newest PostgreSQL Debian installed (postgresql-15 on bookworm).
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  if [ -z "$d" ] || [ ! -x "$d/pg_ctl" ]; then
    log "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin: apt-get install postgresql"
    exit 2
  fi
  echo "$d"
}

# The account the server runs as: PostgreSQL's initdb and postgres refuse root.
owner() {
  if [ "$(id -u)" = 0 ]; then
    id -u postgres >/dev/null 2>&1 || { log "no postgres account: apt-get install postgresql creates it"; exit 2; }
    echo postgres
  else
    id -un
  fi
}

# as_owner CMD...: run CMD as the server's account (root drops to postgres; anyone else is the owner).
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    # From /: the caller's folder may be closed to postgres (pg_ctl would warn that it cannot cd back).
    (cd / && setpriv --reuid="$(id -u postgres)" --regid="$(id -g postgres)" --init-groups -- "$@")
  else
    "$@"
  fi
}

# The cluster's folder: WB_POSTGRES_DIR, else .cache/postgres in this checkout, unless the server's
# account cannot reach this checkout (root's clone under a closed /root) or the socket's path would be
# too long for a Unix socket (107 bytes): then a folder named after this checkout under /var/tmp, so
# every command of this script (and the tests, through `url`) still finds the same server.
pick_dir() {
  if [ -n "${WB_POSTGRES_DIR:-}" ]; then echo "$WB_POSTGRES_DIR"; return; fi
  local dir=$ROOT/.cache/postgres
  if [ $(( ${#dir} + 24 )) -le 107 ] && as_owner test -x "$ROOT" 2>/dev/null; then echo "$dir"; return; fi
  echo "/var/tmp/wb-postgres-$(echo "$ROOT" | cksum | cut -d' ' -f1)"
}

url() {
  # psycopg 3 through SQLAlchemy; host= a directory means that directory's Unix socket.
  echo "postgresql+psycopg://${SUPERUSER}@/postgres?host=${SOCK}&port=${PORT}"
}

answers() { "$(bindir)/pg_isready" -q -h "$SOCK" -p "$PORT" 2>/dev/null; }

cmd_start() {
  local bin user
  bin=$(bindir)
  user=$(owner)
  # The socket's path must fit sockaddr_un (107 bytes) with its name .s.PGSQL.<port>.
  if [ $(( ${#SOCK} + 20 )) -gt 107 ]; then
    log "socket folder $SOCK is too long for a Unix socket: set WB_POSTGRES_DIR to a shorter path"
    exit 2
  fi
  if answers; then log "already running: $(url)"; url; return 0; fi
  mkdir -p "$DIR"
  # The server's account must be able to reach its folders inside this checkout.
  chmod 0755 "$DIR"
  if [ ! -s "$DATA/PG_VERSION" ]; then
    rm -rf "$DATA"
    install -d -m 0700 -o "$user" "$DATA"
    as_owner "$bin/initdb" -D "$DATA" -U "$SUPERUSER" --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1 \
      || { log "initdb failed:"; cat "$DIR/initdb.log" >&2; exit 1; }
  fi
  install -d -m 0700 -o "$user" "$SOCK"
  touch "$LOG" && chown "$user" "$LOG"
  # A stale postmaster.pid (a killed session) is handled by pg_ctl itself: it checks the pid.
  # listen_addresses='': no TCP at all; max_connections: the store's race tests open one connection per thread (200),
  # while the other test lane runs beside them; fsync=off: the data is thrown away, and CREATE DATABASE per test is
  # quicker; timezone=UTC: the tests' raw SQL writes timestamps without a zone, meant as UTC.
  as_owner "$bin/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 \
    -o "-p $PORT -k $SOCK -c listen_addresses='' -c max_connections=500 -c fsync=off -c timezone=UTC" start >/dev/null \
    || { log "pg_ctl start failed:"; tail -20 "$LOG" >&2; exit 1; }
  answers || { log "started but does not answer on $SOCK:"; tail -20 "$LOG" >&2; exit 1; }
  log "up: $(url)"
  url
}

cmd_stop() {
  if [ ! -s "$DATA/postmaster.pid" ]; then return 0; fi
  as_owner "$(bindir)/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null || true
}

DIR=$(pick_dir)
DATA=$DIR/data
SOCK=$DIR/run
LOG=$DIR/server.log

case "${1:-start}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) answers ;;
  url) answers && url ;;
  env) answers && echo "export WORKBENCH_TEST_POSTGRES_URL='$(url)'" ;;
  *) echo "usage: $0 start|stop|status|url|env" >&2; exit 2 ;;
esac
