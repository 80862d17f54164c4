#!/usr/bin/env bash
# A private LemonLDAP::NG 2.16 portal (Debian's packages): a real OpenID Connect provider for the single sign-on
# tests, whose people and groups are the test directory's (tests/identity/slapd.sh).
#
#   tests/identity/lemonldap.sh start RUN_DIR PORT LDAP_URL CA_FILE [HUB_URL...]   # prints one line once it answers
#   tests/identity/lemonldap.sh stop RUN_DIR
#
# LDAP_URL is the directory's ldap://127.0.0.1:PORT (spoken with StartTLS) or ldaps://127.0.0.1:PORT, CA_FILE the CA
# its certificate must chain to. The first start in an empty RUN_DIR writes the configuration
# (tests/identity/lemonldap_conf.py: the issuer http://127.0.0.1:PORT, the client workbench-hub and its secret,
# each HUB_URL's /hub/oauth_callback registered); a later start runs the same configuration, sessions and signing
# key again. The portal is plackup serving lemonldap_portal.psgi on 127.0.0.1:PORT, one process, as whoever runs
# this (root too); its log is RUN_DIR/portal.log. PYTHON (default python3) runs the configuration generator.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/identity/processes.sh
source "$HERE/processes.sh"
ROOT=$(cd "$HERE/../.." && pwd)

log() { echo "lemonldap.sh: $*" >&2; }
usage() {
  log "usage: $0 start RUN_DIR PORT LDAP_URL CA_FILE [HUB_URL...] | stop RUN_DIR"
  exit 2
}

# running_pid: the pid of RUN_DIR's portal if it runs (a pid file left by a crash may name another process now).
running_pid() {
  local pid
  pid=$(cat "$RUN/portal.pid" 2>/dev/null) || return 1
  # plackup sets its process title to its own path
  [ -n "$pid" ] && alive "$pid" && grep -qa plackup "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

# answers PORT: the discovery document answers 200 (the first request also loads the portal's configuration).
# Bash's /dev/tcp: no curl needed.
answers() {
  local status=''
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET /.well-known/openid-configuration HTTP/1.0\r\nHost: 127.0.0.1:%s\r\n\r\n' "$1" >&3
  read -r -t 5 _ status _ <&3 || true
  exec 3<&- 3>&-
  [ "$status" = 200 ]
}

cmd_start() {
  [ $# -ge 4 ] || usage
  RUN=$1
  local port=$2 ldap_url=$3 ca=$4 pid i t0=${EPOCHREALTIME/./}
  shift 4
  command -v plackup >/dev/null || {
    log "no plackup: apt-get install liblemonldap-ng-portal-perl lemonldap-ng-fastcgi-server libnet-ldap-perl libcrypt-openssl-bignum-perl"
    exit 2
  }
  mkdir -p "$RUN"
  RUN=$(cd "$RUN" && pwd)
  if pid=$(running_pid); then
    log "a portal of $RUN runs already (pid $pid)"
    return 0
  fi
  if [ ! -s "$RUN/lemonldap-ng.ini" ]; then
    [ -r "$ca" ] || { log "no CA file $ca"; exit 2; }
    (cd "$ROOT" && "${PYTHON:-python3}" -m tests.identity.lemonldap_conf "$RUN" "$port" "$ldap_url" "$ca" "$@") >/dev/null
  fi
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    log "port $port is taken by another server"
    exit 1
  fi
  LLNG_DEFAULTCONFFILE=$RUN/lemonldap-ng.ini plackup -s HTTP::Server::PSGI --host 127.0.0.1 --port "$port" \
    --no-default-middleware "$HERE/lemonldap_portal.psgi" >>"$RUN/portal.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$RUN/portal.pid"
  for i in $(seq 1 300); do
    answers "$port" 2>/dev/null && break
    if ! alive "$pid"; then
      log "the portal exited at start (port $port in use? a Perl module missing?); the end of $RUN/portal.log:"
      tail -n 20 "$RUN/portal.log" >&2
      exit 1
    fi
    sleep 0.05
  done
  if ! answers "$port" 2>/dev/null; then
    log "the portal (pid $pid) does not answer on http://127.0.0.1:$port after 15 s; the end of $RUN/portal.log:"
    tail -n 20 "$RUN/portal.log" >&2
    exit 1
  fi
  echo "lemonldap: issuer http://127.0.0.1:$port, directory $ldap_url ($(((${EPOCHREALTIME/./} - t0) / 1000)) ms)"
}

cmd_stop() {
  [ $# -eq 1 ] || usage
  RUN=$1
  [ -d "$RUN" ] || return 0
  RUN=$(cd "$RUN" && pwd)
  local pid
  if pid=$(running_pid); then
    stop_process "$pid" "the portal"
  fi
  rm -f "$RUN/portal.pid"
}

case ${1:-} in
  start) shift && cmd_start "$@" ;;
  stop) shift && cmd_stop "$@" ;;
  *) usage ;;
esac
