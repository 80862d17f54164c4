#!/usr/bin/env bash
# A private OpenLDAP slapd (Debian's 2.5 binaries) holding the test directory, for the LDAP and single sign-on tests.
#
#   tests/identity/slapd.sh start RUN_DIR LDAP_PORT LDAPS_PORT   # prints one line once it answers
#   tests/identity/slapd.sh stop RUN_DIR
#
# The first start in an empty RUN_DIR makes everything there: a CA of its own and a server certificate for
# 127.0.0.1 and localhost (RUN_DIR/tls/ca.crt is what clients trust), a cn=config from directory/config.ldif.in,
# the entries of directory/people.ldif.in loaded offline with slapadd, then, through the running server,
# directory/groups.ldif (memberOf is kept by an overlay, and overlays do not run under slapadd). A later start in
# the same RUN_DIR starts the same data again (the "directory down, then back" tests). The passwords are in
# directory/passwords, the one place they are written down.
#
# slapd listens on 127.0.0.1 only: LDAP_PORT (StartTLS), LDAPS_PORT (TLS from the first byte) and an ldapi
# socket (RUN_DIR/ldapi, or a short path under /tmp when RUN_DIR's is too long for a Unix socket; the URL is in
# RUN_DIR/ldapi.url), where the fixtures bind as the rootdn. It runs in the foreground of a background job, as
# whoever runs this (root too), never as Debian's system service: /etc/ldap is not read or changed.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/identity/processes.sh
source "$HERE/processes.sh"
DATA=$HERE/directory
BASE=dc=workbench,dc=test
ADMIN_DN=cn=admin,$BASE
PATH=$PATH:/usr/sbin:/sbin # slapd and slapadd are in /usr/sbin, outside an ordinary account's PATH

log() { echo "slapd.sh: $*" >&2; }
usage() {
  log "usage: $0 start RUN_DIR LDAP_PORT LDAPS_PORT | stop RUN_DIR"
  exit 2
}

# password ACCOUNT: its password in directory/passwords.
password() {
  local name pw _
  while read -r name pw _; do
    [ "$name" = "$1" ] && { echo "$pw"; return; }
  done < <(grep -v '^[[:space:]]*\(#\|$\)' "$DATA/passwords")
  log "no account $1 in $DATA/passwords"
  exit 2
}

# urlencode STRING: STRING with every byte but [A-Za-z0-9._~-] as %XX (an ldapi URL holds a path).
urlencode() {
  local s=$1 out='' c i
  for ((i = 0; i < ${#s}; i++)); do
    c=${s:i:1}
    case $c in
      [A-Za-z0-9._~-]) out+=$c ;;
      *) out+=$(printf '%%%02X' "'$c") ;;
    esac
  done
  echo "$out"
}

# The ldapi socket's folder: RUN_DIR itself, unless the socket's path would pass sockaddr_un's 107 bytes
# (pytest's tmp_path for a long test name); then a folder named after RUN_DIR under /tmp, the same on each start.
socket_dir() {
  if [ $((${#RUN} + 6)) -le 100 ]; then
    echo "$RUN"
  else
    echo "/tmp/wb-slapd-$(echo "$RUN" | cksum | cut -d' ' -f1)"
  fi
}

# running_pid: the pid of RUN_DIR's slapd if it runs (a pid file left by a crash may name another process now).
running_pid() {
  local pid
  pid=$(cat "$RUN/slapd.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && alive "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slapd ] && echo "$pid"
}

make_tls() {
  # EC P-256 (fast to make, and Debian's GnuTLS-built slapd takes it). Made again when it ends within an hour.
  if [ -s "$RUN/tls/server.crt" ] && openssl x509 -checkend 3600 -noout -in "$RUN/tls/server.crt" >/dev/null 2>&1; then
    return
  fi
  (
    cd "$RUN/tls"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 \
      -subj "/CN=GPU Workbench test directory CA" -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -subj "/CN=localhost" -keyout server.key -out server.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >ext.cnf
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 7 \
      -extfile ext.cnf -out server.crt 2>/dev/null
    chmod 600 ca.key server.key
    rm -f server.csr ext.cnf ca.srl
  )
}

# The directory's files, made once per RUN_DIR: cn=config and the entries (offline), the rootdn's password file.
make_directory() {
  local ldif=$RUN/people.ldif name pw _ hash admin_hash=''
  cp "$DATA/people.ldif.in" "$ldif"
  while read -r name pw _; do
    hash=$(slappasswd -h '{SSHA}' -s "$pw")
    if [ "$name" = admin ]; then admin_hash=$hash; else sed -i "s|@PW_${name}@|$hash|" "$ldif"; fi
  done < <(grep -v '^[[:space:]]*\(#\|$\)' "$DATA/passwords")
  if grep -v '^#' "$ldif" | grep -q '@PW_'; then
    log "$DATA/passwords lacks the password of: $(grep -v '^#' "$ldif" | grep -o '@PW_[^@]*@' | tr '\n' ' ')"
    exit 2
  fi
  sed -e "s|@RUN@|$RUN|g" -e "s|@ADMINHASH@|$admin_hash|" -e "s|@UID@|$(id -u)|" -e "s|@GID@|$(id -g)|" \
    "$DATA/config.ldif.in" >"$RUN/config.ldif"
  slapadd -q -n 0 -F "$RUN/slapd.d" -l "$RUN/config.ldif"
  slapadd -q -n 1 -F "$RUN/slapd.d" -l "$ldif"
  (umask 077 && printf '%s' "$(password admin)" >"$RUN/admin.pw") # ldap-utils' -y: the file's bytes, no newline
}

cmd_start() {
  [ $# -eq 3 ] || usage
  RUN=$1
  local port=$2 sport=$3 pid fresh=0 sock ldapi i t0=${EPOCHREALTIME/./}
  command -v slapd >/dev/null || { log "no slapd: apt-get install slapd ldap-utils"; exit 2; }
  mkdir -p "$RUN"
  RUN=$(cd "$RUN" && pwd)
  if pid=$(running_pid); then
    log "a slapd of $RUN runs already (pid $pid)"
    return 0
  fi
  mkdir -p "$RUN/tls"
  make_tls
  if [ ! -d "$RUN/slapd.d/cn=config" ]; then
    rm -rf "$RUN/slapd.d" "$RUN/data"
    mkdir -p "$RUN/slapd.d" "$RUN/data"
    make_directory
    fresh=1
  fi
  sock=$(socket_dir)
  mkdir -p "$sock"
  rm -f "$sock/ldapi"
  ldapi="ldapi://$(urlencode "$sock/ldapi")"
  echo "$ldapi" >"$RUN/ldapi.url"
  # -d 0: in the foreground (its pid is $!), logging nothing but what stops it; slapd rewrites the pid file itself.
  slapd -d 0 -h "ldap://127.0.0.1:$port/ ldaps://127.0.0.1:$sport/ $ldapi" -F "$RUN/slapd.d" \
    >>"$RUN/slapd.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$RUN/slapd.pid"
  for i in $(seq 1 200); do
    ldapwhoami -x -H "$ldapi" >/dev/null 2>&1 && break
    if ! alive "$pid"; then
      log "slapd exited at start (ports $port, $sport in use?); the end of $RUN/slapd.log:"
      tail -n 20 "$RUN/slapd.log" >&2
      exit 1
    fi
    sleep 0.025
  done
  if ! ldapwhoami -x -H "$ldapi" >/dev/null 2>&1; then
    log "slapd (pid $pid) does not answer on $ldapi after 5 s"
    exit 1
  fi
  if [ "$fresh" = 1 ]; then
    ldapadd -x -H "$ldapi" -D "$ADMIN_DN" -y "$RUN/admin.pw" -f "$DATA/groups.ldif" >/dev/null
  fi
  echo "slapd: ldap://127.0.0.1:$port (StartTLS), ldaps://127.0.0.1:$sport, $ldapi, CA $RUN/tls/ca.crt ($(((${EPOCHREALTIME/./} - t0) / 1000)) ms)"
}

cmd_stop() {
  [ $# -eq 1 ] || usage
  RUN=$1
  [ -d "$RUN" ] || return 0
  RUN=$(cd "$RUN" && pwd)
  local pid sock
  if pid=$(running_pid); then
    stop_process "$pid" "slapd"
  fi
  rm -f "$RUN/slapd.pid"
  sock=$(socket_dir)
  rm -f "$sock/ldapi"
  [ "$sock" = "$RUN" ] || rmdir "$sock" 2>/dev/null || true
}

case ${1:-} in
  start) shift && cmd_start "$@" ;;
  stop) shift && cmd_stop "$@" ;;
  *) usage ;;
esac
