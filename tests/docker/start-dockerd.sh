#!/usr/bin/env bash
# Start a Docker Engine for the test suite, unless one already answers.
#
# - Idempotent: if `docker info` works, it prints the server version and exits 0.
# - Otherwise starts dockerd in the background with tests/docker/stand-in-nvidia
#   first on ITS PATH, so GPU device requests (driver "nvidia") are accepted on a
#   machine without the NVIDIA Container Toolkit, then waits until `docker info`
#   works (WORKBENCH_DOCKERD_TIMEOUT seconds, default 60) or fails with the log tail.
#
# Environment:
#   WORKBENCH_DOCKERD_LOG      dockerd log file (default /tmp/workbench-dockerd.log)
#   WORKBENCH_DOCKERD_TIMEOUT  seconds to wait for the daemon (default 60)
#   DOCKERD_EXTRA_ARGS         extra dockerd arguments (e.g. --storage-driver=vfs)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
hookdir="$here/stand-in-nvidia"
log="${WORKBENCH_DOCKERD_LOG:-/tmp/workbench-dockerd.log}"
timeout="${WORKBENCH_DOCKERD_TIMEOUT:-60}"

# Whether the running dockerd finds an nvidia-container-runtime-hook on its own PATH (read from /proc): a
# daemon started from a checkout that was deleted since has lost the stand-in, and every GPU device
# request then fails with 'exec: "nvidia-container-runtime-hook": executable file not found in $PATH'.
hook_on_daemon_path() {
    local pid dir
    pid=$(pgrep -o -x dockerd) || return 0
    for dir in $(tr '\0' '\n' <"/proc/$pid/environ" | sed -n 's/^PATH=//p' | tr ':' ' '); do
        [ -x "$dir/nvidia-container-runtime-hook" ] && return 0
    done
    return 1
}

if docker info >/dev/null 2>&1; then
    if hook_on_daemon_path; then
        echo "dockerd already running (server $(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
        exit 0
    fi
    old_pid=$(pgrep -o -x dockerd)
    echo "start-dockerd: the running dockerd (pid $old_pid) has no nvidia-container-runtime-hook on its PATH" \
        "(started from a checkout that is gone?); restarting it with $hookdir"
    kill "$old_pid"
    for _ in $(seq 60); do kill -0 "$old_pid" 2>/dev/null || break; sleep 1; done
fi

if ! command -v dockerd >/dev/null 2>&1; then
    echo "start-dockerd: dockerd not found (apt-get install docker.io)" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "start-dockerd: no dockerd answers and starting one needs root" >&2
    exit 1
fi

# A pid file is stale when no process of that name holds the pid. A session that ends kills
# dockerd and its containerd without letting them remove their pid files; once the kernel hands
# the pid to another process, dockerd believes "containerd is still running", waits for a socket
# that never comes and exits with "timeout waiting for containerd to start".
pid_of() { [ -s "$1" ] && tr -dc 0-9 <"$1"; }
holds() { [ -n "$2" ] && [ "$(cat "/proc/$2/comm" 2>/dev/null)" = "$1" ]; }
drop_stale_pid_file() {
    local name=$1 file=$2 pid
    pid=$(pid_of "$file" || true)
    if [ -e "$file" ] && ! holds "$name" "$pid"; then
        echo "start-dockerd: removing stale $file (pid ${pid:-none} is not $name)"
        rm -f "$file"
    fi
}

if pgrep -x dockerd >/dev/null; then
    # A daemon is already starting (or stuck): starting a second one would fight over its state.
    echo "start-dockerd: a dockerd process exists but does not answer yet; waiting for it"
else
    drop_stale_pid_file containerd /var/run/docker/containerd/containerd.pid
    drop_stale_pid_file dockerd /var/run/docker.pid
fi

chmod +x "$hookdir/nvidia-container-runtime-hook"
if pid=$(pgrep -o -x dockerd); then
    :
else
    echo "starting dockerd (log: $log, stand-in NVIDIA hook: $hookdir)"
    # setsid: the daemon must outlive this script and the caller's process group.
    # shellcheck disable=SC2086
    PATH="$hookdir:$PATH" setsid dockerd ${DOCKERD_EXTRA_ARGS:-} >>"$log" 2>&1 </dev/null &
    pid=$!
fi
echo "$pid" > /tmp/workbench-dockerd.pid

for _ in $(seq "$timeout"); do
    if docker info >/dev/null 2>&1; then
        echo "dockerd ready (pid $pid, server $(docker version --format '{{.Server.Version}}'))"
        exit 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "start-dockerd: dockerd exited; last lines of $log:" >&2
        tail -n 30 "$log" >&2
        exit 1
    fi
    sleep 1
done
echo "start-dockerd: dockerd did not answer within ${timeout}s; last lines of $log:" >&2
tail -n 30 "$log" >&2
exit 1
