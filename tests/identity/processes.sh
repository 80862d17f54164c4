# Sourced by slapd.sh and lemonldap.sh: is a server's process alive, and stop it. Needs log() from the caller.

# alive PID: the process runs; a zombie does not count (its ports are closed; the init here may reap it late).
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# stop_process PID WHAT: SIGTERM, up to 5 s to end, then SIGKILL (WHAT names it in the log line).
stop_process() {
  local pid=$1 what=$2 i
  kill "$pid"
  for i in $(seq 1 100); do
    alive "$pid" || return 0
    sleep 0.05
  done
  log "$what (pid $pid) still runs 5 s after SIGTERM: SIGKILL"
  kill -9 "$pid" 2>/dev/null || true
}
