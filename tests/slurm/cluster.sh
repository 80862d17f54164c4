#!/usr/bin/env bash
# A real two-node Slurm cluster on this one machine, for tests and CI.
#
#   tests/slurm/cluster.sh start    # idempotent: leaves a healthy cluster running
#   tests/slurm/cluster.sh status   # exit 0 if both nodes are up
#   tests/slurm/cluster.sh stop
#
# Layout (Debian's slurm-wlm 22.05, munge):
#   slurmctld on this host, reachable at 10.77.0.1;
#   node wbnode1: slurmd in its own UTS + mount namespace on the host network (NodeAddr 10.77.0.1);
#   node wbnode2: slurmd in a network namespace `wbslurm2` (veth, NodeAddr 10.77.0.2) plus its own UTS +
#   mount namespace. Each slurmd gets a private /run/wb-slurmd (pid file), its own spool dir (%n) and log.
#   We do not rely on Debian's build having --enable-multiple-slurmd: the namespaces make each slurmd
#   think it is alone, and each finds its NodeName from its own host name.
# Every node declares 2 fake whole GPUs of type h100-80gb in gres.conf as character devices (slurmd
# refuses plain files): wbnode1 /dev/nvidia0-1, wbnode2 /dev/nvidia2-3 (4 whole GPUs in the cluster).
# wbnode2 also has an H200 laid out as MIG slices, one GRES type per profile as a site writes them by
# hand: two 1g.18gb and one 3g.71gb, whose files are fake /dev/nvidia-caps/nvidia-cap21..23. Slurm numbers
# a node's GPUs across its gres.conf lines in order, so wbnode2's GRES indices are 0-1 the H100s,
# 2-3 the 1g.18gb slices and 4 the 3g.71gb slice (the hub's simulated spec lists them in that order:
# tests/slurm/conftest.py SIMULATED). A whole-GPU job asks for its type (gpu:h100-80gb:1), or Slurm
# could hand it a slice.
# select/cons_tres; no cgroup confinement (proctrack/linuxproc, task/none: two slurmd on one kernel
# would fight over one cgroup tree), so Slurm's job detail is the only truth about GPU indices.
set -euo pipefail

STATE=${WB_SLURM_STATE:-/var/lib/wb-slurm}
CONF_DIR=/etc/slurm
NS=wbslurm2
HOST_IP=10.77.0.1
NODE2_IP=10.77.0.2
CTL_HOST=$(hostname -s)

log() { echo "cluster.sh: $*" >&2; }

need_root() {
  if [ "$(id -u)" != 0 ]; then log "must run as root (it starts munged, slurmctld and slurmd)"; exit 2; fi
  for bin in munged slurmctld slurmd sinfo scontrol ip unshare; do
    command -v "$bin" >/dev/null || { log "$bin is missing: apt-get install slurm-wlm munge iproute2"; exit 2; }
  done
}

write_config() {
  mkdir -p "$STATE"/{ctld,log} "$STATE"/wbnode1/{spool,run} "$STATE"/wbnode2/{spool,run} "$CONF_DIR"
  cat >"$CONF_DIR/slurm.conf.new" <<EOF
# Written by tests/slurm/cluster.sh: a two-node test cluster on one machine.
ClusterName=workbench
SlurmctldHost=${CTL_HOST}(${HOST_IP})
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=${STATE}/ctld
SlurmdSpoolDir=${STATE}/%n/spool
SlurmctldPidFile=${STATE}/slurmctld.pid
SlurmdPidFile=/run/wb-slurmd/slurmd.pid
SlurmctldLogFile=${STATE}/log/slurmctld.log
SlurmdLogFile=${STATE}/log/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MessageTimeout=10
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=30
DefMemPerCPU=256
MpiDefault=none
NodeName=wbnode1 NodeAddr=${HOST_IP} CPUs=4 RealMemory=4000 Gres=gpu:h100-80gb:2 State=UNKNOWN
NodeName=wbnode2 NodeAddr=${NODE2_IP} CPUs=4 RealMemory=4000 Gres=gpu:h100-80gb:2,gpu:1g.18gb:2,gpu:3g.71gb:1 State=UNKNOWN
PartitionName=gpu Nodes=wbnode1,wbnode2 Default=YES MaxTime=INFINITE State=UP
PartitionName=debug Nodes=wbnode1 Default=NO MaxTime=60 State=UP
EOF
  cat >"$CONF_DIR/gres.conf.new" <<EOF
# Fake GPUs: character devices made by cluster.sh (mknod c 195 N); each node has its own files.
NodeName=wbnode1 Name=gpu Type=h100-80gb File=/dev/nvidia[0-1]
NodeName=wbnode2 Name=gpu Type=h100-80gb File=/dev/nvidia[2-3]
# MIG slices of wbnode2's H200 (its parent /dev/nvidia4 is not a GRES: it is never handed out whole).
NodeName=wbnode2 Name=gpu Type=1g.18gb File=/dev/nvidia-caps/nvidia-cap[21-22]
NodeName=wbnode2 Name=gpu Type=3g.71gb File=/dev/nvidia-caps/nvidia-cap23
EOF
  cat >"$CONF_DIR/cgroup.conf.new" <<EOF
# No confinement in the test cluster (see cluster.sh); a site sets ConstrainDevices=yes.
CgroupPlugin=autodetect
IgnoreSystemd=yes
ConstrainCores=no
ConstrainDevices=no
ConstrainRAMSpace=no
EOF
  local changed=0
  for f in slurm.conf gres.conf cgroup.conf; do
    if ! cmp -s "$CONF_DIR/$f.new" "$CONF_DIR/$f"; then mv "$CONF_DIR/$f.new" "$CONF_DIR/$f"; changed=1
    else rm -f "$CONF_DIR/$f.new"; fi
  done
  echo $changed
}

make_devices() {
  for i in 0 1 2 3 4; do
    if [ ! -c "/dev/nvidia$i" ]; then rm -f "/dev/nvidia$i"; mknod -m 666 "/dev/nvidia$i" c 195 "$i"; fi
  done
  # MIG slices' capability files (the driver's nvidia-caps major is dynamic; any char device will do here).
  mkdir -p /dev/nvidia-caps
  for i in 21 22 23; do
    local f=/dev/nvidia-caps/nvidia-cap$i
    if [ ! -c "$f" ]; then rm -f "$f"; mknod -m 444 "$f" c 236 "$i"; fi
  done
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 2>/dev/null
    chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.1; done
  log "munged did not come up"; exit 1
}

make_netns() {
  # No `cmd | grep -q` under pipefail: grep exits early, cmd gets SIGPIPE and the test reads as false.
  [ -e "/run/netns/$NS" ] || ip netns add "$NS"
  if ! ip link show wbs0 >/dev/null 2>&1; then
    ip link add wbs0 type veth peer name wbs2
    ip link set wbs2 netns "$NS"
  fi
  case "$(ip -4 addr show wbs0)" in *"$HOST_IP/"*) ;; *) ip addr add "$HOST_IP/24" dev wbs0 ;; esac
  ip link set wbs0 up
  ip netns exec "$NS" sh -c "ip addr show wbs2 | grep -q '$NODE2_IP/' || ip addr add $NODE2_IP/24 dev wbs2
    ip link set wbs2 up; ip link set lo up; ip route replace default via $HOST_IP"
}

# pid_alive FILE NAME: FILE names a live process called NAME. Checking the name matters: a session
# that ends kills the daemons without removing their pid files, and the kernel hands those pids out
# again, so `kill -0` alone would take a stranger for slurmctld and skip starting it.
pid_alive() { [ -s "$1" ] && [ "$(cat "/proc/$(tr -dc 0-9 <"$1")/comm" 2>/dev/null)" = "$2" ]; }

start_ctld() {
  if pid_alive "$STATE/slurmctld.pid" slurmctld; then
    if [ "$1" = 1 ]; then scontrol reconfigure >/dev/null; fi
    return 0
  fi
  slurmctld -i   # -i: ignore a stale state file that no longer matches the config
}

start_node() {
  local node=$1 netns_prefix=$2
  if pid_alive "$STATE/$node/run/slurmd.pid" slurmd; then return 0; fi
  $netns_prefix unshare --uts --mount --propagation private sh -c "
    hostname $node
    mkdir -p /run/wb-slurmd && mount --bind '$STATE/$node/run' /run/wb-slurmd
    exec slurmd"
}

wait_idle() {
  for _ in $(seq 120); do
    local states
    states=$(sinfo -h -N -p gpu -o '%N %t' 2>/dev/null | sort -u || true)
    if [ "$(echo "$states" | grep -cE ' (idle|mix|alloc)$')" = 2 ]; then return 0; fi
    # A node that was down (an earlier run stopped it) is put back in service.
    for n in $(echo "$states" | awk '$2 ~ /down|drain|fail/ {print $1}'); do
      scontrol update NodeName="$n" State=RESUME 2>/dev/null || true
    done
    sleep 0.5
  done
  log "nodes not idle in 60 s:"; sinfo -N -l >&2 || true; tail -20 "$STATE"/log/*.log >&2 || true
  return 1
}

cmd_start() {
  need_root
  local changed; changed=$(write_config)
  make_devices
  # A node's GRES (gres.conf, Gres= in slurm.conf) is read only when the daemons start: restart them.
  if [ "$changed" = 1 ]; then log "configuration changed: restarting the daemons"; cmd_stop; fi
  start_munge
  make_netns
  start_ctld "$changed"
  start_node wbnode1 ""
  start_node wbnode2 "nsenter --net=/run/netns/$NS"  # not `ip netns exec`: it remounts /sys without the cgroup tree slurmd reads
  wait_idle
  log "up: $(sinfo -h -N -p gpu -o '%N=%t(%G)' | tr '\n' ' ')"
}

cmd_stop() {
  local pids=()
  for f in "$STATE"/wbnode1/run/slurmd.pid:slurmd "$STATE"/wbnode2/run/slurmd.pid:slurmd "$STATE"/slurmctld.pid:slurmctld; do
    if pid_alive "${f%:*}" "${f##*:}"; then pids+=("$(tr -dc 0-9 <"${f%:*}")"); kill "${pids[-1]}"; fi
  done
  for _ in $(seq 100); do
    local alive=0
    for p in "${pids[@]}"; do [ -d "/proc/$p" ] && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
  log "daemons still running 10 s after SIGTERM: ${pids[*]}"
}

case "${1:-start}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) [ "$(sinfo -h -N -p gpu -o '%t' 2>/dev/null | grep -cE 'idle|mix|alloc')" = 2 ] ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
