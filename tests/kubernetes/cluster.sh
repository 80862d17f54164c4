#!/usr/bin/env bash
# A real one-node Kubernetes 1.20 cluster on this one machine, with simulated NVIDIA GPUs, for tests and CI.
#
#   tests/kubernetes/cluster.sh start    # idempotent: leaves a healthy cluster running, prints how long it took
#   tests/kubernetes/cluster.sh status   # exit 0 if the API answers and the node is Ready with GPUs
#   tests/kubernetes/cluster.sh stop     # stops everything, removes the pods' containers, puts sysctls back
#   tests/kubernetes/cluster.sh api-stop # stops only the API server (an outage: etcd, the node and pods run on)
#   tests/kubernetes/cluster.sh api-start # brings it back (a `start`: only what is down is started) and waits
#                                        # for the node to be Ready again
#
# Then: KUBECONFIG=$STATE/admin.kubeconfig (cluster-admin, a static token).
#
# Layout (binaries from tests/kubernetes/build.sh, Debian's kubernetes 1.20 source; etcd from Debian):
#   etcd                      127.0.0.1:12379 (peer 12380), data in $STATE/etcd
#   kube-apiserver            https://127.0.0.1:16443, token auth (no anonymous), Node+RBAC authorization
#   kube-controller-manager   healthz on 127.0.0.1:16457, scheduler on 127.0.0.1:16459 (no leader election)
#   kubelet                   node wbk8s-node1 at 172.17.0.1 (docker0), port 10350, healthz 127.0.0.1:10348;
#                             dockershim drives the machine's Docker, pods are plain containers on docker0
#   device_plugin.py          the stand-in NVIDIA device plugin: nvidia.com/gpu = the simulated GPUs,
#                             nvidia.com/mig-<profile> = the simulated MIG slices (the "mixed" strategy)
#   provisioner.py            a stand-in volume provisioner: storage class workbench-test-local, a folder
#                             per claim under $STATE/volumes (the backend's per-user homes)
# Nothing listens beyond loopback except the kubelet on docker0's address (the API server reaches it
# there for logs and exec; the kubelet refuses 127.0.0.1 as a node IP). Ports are away from the defaults
# so a real cluster's components on the same machine would not collide.
#
# Simulated GPUs: WB_K8S_GPUS, a workbench_devices spec; the default is four whole H200 (the conformance
# tiers offer four) and a fifth laid out as MIG slices 2x1g.18gb+1x3g.71gb. The device IDs are
# exactly parse_simulated_spec(spec, "wbk8s-node1")'s UUIDs, the ones the hub's simulated inventory
# shows, and the node carries the labels NVIDIA's GPU Feature Discovery would put on it.
#
# State: WB_K8S_STATE (default /var/lib/wb-k8s): pki/, etcd/, kubelet/, proto/, run/ (pid files), log/.
# The kubelet itself insists on /var/lib/kubelet (its device-plugin folder is fixed in 1.20),
# /var/lib/dockershim, /var/log/pods and cgroups named kubepods: `stop` removes what the pods left there
# (containers, volume mounts, sockets, checkpoints, logs, cgroups) and keeps the cluster's state, so the
# next `start` finds its node, namespaces and credentials again.
#
# Only root may use it: etcd on 127.0.0.1:12379 has no authentication (anyone local who can reach it
# owns the cluster); the admin kubeconfig and the keys are mode 600 in a folder of mode 700.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
STATE=${WB_K8S_STATE:-/var/lib/wb-k8s}
PKI=$STATE/pki
RUN=$STATE/run
LOGS=$STATE/log
PY=${WB_K8S_PYTHON:-$REPO/.venv/bin/python}
GPUS=${WB_K8S_GPUS:-4xH200-141GB,1xH200-141GB:mig=2x1g.18gb+1x3g.71gb}

NODE=wbk8s-node1
NODE_IP=172.17.0.1
API_PORT=16443
API_URL=https://127.0.0.1:$API_PORT
ETCD_CLIENT=127.0.0.1:12379
ETCD_PEER=127.0.0.1:12380
CM_PORT=16457
SCHED_PORT=16459
KUBELET_PORT=10350
KUBELET_HEALTHZ=10348
SERVICE_RANGE=10.96.0.0/16
KUBELET_ROOT=/var/lib/kubelet
PAUSE_IMAGE=workbench/k8s-pause:3.4
BUSYBOX_IMAGE=workbench/k8s-busybox:test
# The sysctls the kubelet sets on every start (setupKernelTunables); put back once the node is Ready.
SYSCTLS="vm.overcommit_memory kernel.panic kernel.panic_on_oops"

log() { echo "cluster.sh: $*" >&2; }
die() { log "$*"; exit 1; }

need_root() {
  if [ "$(id -u)" != 0 ]; then log "must run as root (it starts a kubelet that drives Docker)"; exit 2; fi
  local need=()
  command -v openssl >/dev/null || need+=(openssl)
  command -v curl >/dev/null || need+=(curl)
  command -v jq >/dev/null || need+=(jq)
  # A static busybox is the test pods' image (below): no registry is reachable. (Debian's `busybox`
  # is dynamically linked and replaces it: it would not run in an image with nothing else in it.)
  dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
  if [ ${#need[@]} -gt 0 ]; then
    log "apt-get install ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  [ -x "$PY" ] || die "no Python at $PY (run \`make\` for the repo's .venv, or set WB_K8S_PYTHON)"
}

# ---------------------------------------------------------------------------------------------------
# Processes. Each daemon's pid file sits in $RUN with the command line it was started with: `start`
# leaves a running daemon alone only when that command (and the checksum of its config file) is
# unchanged, so a changed flag or WB_K8S_GPUS restarts just that daemon, and a second `start` is a
# no-op.

# alive NAME: the pid file names a live process that runs what we started. Checking the command line
# matters: a session that ends kills the daemons without removing their pid files, and the kernel hands
# those pids out again, so `kill -0` alone would take a stranger for the API server.
alive() {
  local pid
  pid=$({ tr -dc 0-9 <"$RUN/$1.pid"; } 2>/dev/null) && [ -n "$pid" ] || return 1
  [ "$({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null)" = "$(cat "$RUN/$1.cmd" 2>/dev/null) " ]
}

# launch NAME CONFIG_FILE CMD...: start CMD as daemon NAME unless it already runs exactly so.
# setsid: the daemons must outlive the caller's process group (pytest's timeout, a Ctrl-C of `make`).
# Output goes to $LOGS/NAME.log, never to our stdout: pytest captures it and would wait on the pipe.
launch() {
  local name=$1 config=$2; shift 2
  local want="$*" sum=""
  [ -n "$config" ] && sum=$(sha256sum "$config" | cut -c1-16)
  if alive "$name" && [ "$(cat "$RUN/$name.cmd")" = "$want" ] && [ "$(cat "$RUN/$name.sum" 2>/dev/null)" = "$sum" ]; then
    return 0
  fi
  halt "$name"
  echo "$want" >"$RUN/$name.cmd"
  echo "$sum" >"$RUN/$name.sum"
  # The previous run's log is kept as .1 (what went wrong last time), older ones are dropped.
  if [ -s "$LOGS/$name.log" ]; then mv "$LOGS/$name.log" "$LOGS/$name.log.1"; fi
  echo "--- $(date -u +%FT%TZ) starting $name" >"$LOGS/$name.log"
  date +%s >"$RUN/$name.started"
  setsid "$@" </dev/null >>"$LOGS/$name.log" 2>&1 8>&- &  # 8: the start lock, which daemons must not keep
  echo $! >"$RUN/$name.pid"
  STARTED+=("$name")
}

# halt NAME: SIGTERM, up to 15 s for a clean exit (etcd and the kubelet write state), then SIGKILL.
# The API server keeps nothing of its own but waits for its clients' open watches to end (the hub's,
# a test's), which can take a minute: it gets 5 s.
halt() {
  local name=$1 pid tenths=150
  [ "$name" = kube-apiserver ] && tenths=50
  if alive "$name"; then
    pid=$(cat "$RUN/$name.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq $tenths); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
    if [ -d "/proc/$pid" ]; then
      log "$name did not stop in $((tenths / 10)) s: SIGKILL"
      kill -9 "$pid" 2>/dev/null || true
      for _ in $(seq 20); do [ -d "/proc/$pid" ] || break; sleep 0.1; done  # its ports free again
    fi
  fi
  rm -f "$RUN/$name.pid"
}

# wait_for NAME SECONDS WHAT CMD...: poll CMD until it succeeds. Returns 1 (after the end of NAME's
# log, where the reason nearly always is) when daemon NAME exits meanwhile or time runs out.
wait_for() {
  local name=$1 seconds=$2 what=$3; shift 3
  local deadline=$((SECONDS + seconds))
  while ! "$@" >/dev/null 2>&1; do
    if ! alive "$name"; then
      log "$name exited while waiting for $what; end of $LOGS/$name.log:"; tail -25 "$LOGS/$name.log" >&2
      return 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      log "$what: not within $seconds s; end of $LOGS/$name.log:"; tail -25 "$LOGS/$name.log" >&2
      return 1
    fi
    sleep 0.3
  done
}

# ---------------------------------------------------------------------------------------------------
# Credentials, made once and kept with the state: a CA, the API server's serving certificate, a client
# certificate the API server shows the kubelet, a service-account key pair and static tokens.

make_pki() {
  if [ -s "$PKI/tokens.csv" ]; then return 0; fi
  local tmp=$PKI.tmp
  rm -rf "$tmp"; mkdir -p "$tmp"; chmod 700 "$tmp"
  (
    cd "$tmp"
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -subj "/CN=wbk8s-ca" \
      -keyout ca.key -out ca.crt 2>/dev/null
    # sign NAME SUBJECT [SAN]: a key and a certificate from the CA.
    sign() {
      openssl req -newkey rsa:2048 -nodes -sha256 -subj "$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
      printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=%s\n%s\n' \
        "$([ -n "${3:-}" ] && echo serverAuth || echo clientAuth)" "${3:+subjectAltName=$3}" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -sha256 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    # 10.96.0.1 and the kubernetes.default names: what in-cluster clients would dial.
    sign apiserver "/CN=kube-apiserver" \
      "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    # system:masters: the kubelet's webhook authorization then lets the API server fetch logs and exec.
    sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    # The kubelet is a proper node identity (the Node authorizer confines it to its own node and pods);
    # everything else uses the admin token.
    printf '%s,admin,admin,"system:masters"\n%s,system:node:%s,node:%s,"system:nodes"\n' \
      "$(openssl rand -hex 24)" "$(openssl rand -hex 24)" "$NODE" "$NODE" >tokens.csv
    chmod 600 ./*.key tokens.csv
  )
  rm -rf "$PKI"; mv "$tmp" "$PKI"
}

token_of() { awk -F, -v u="$1" '$2 == u {print $1}' "$PKI/tokens.csv"; }

# kubeconfig FILE USER: a kubeconfig for the API server on loopback with USER's token.
kubeconfig() {
  local tmp=$1.tmp
  (umask 077; cat >"$tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: wbk8s
  cluster:
    server: $API_URL
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    token: $(token_of "$2")
contexts:
- name: wbk8s
  context: {cluster: wbk8s, user: $2}
current-context: wbk8s
EOF
  )
  mv "$tmp" "$1"
}

# api PATH [CURL ARGS]: the API as admin. The token comes from a header file, not argv, where any
# local account could read it in /proc.
# -A: NOT curl's own User-Agent. The API server pretty-prints JSON for curl and wget, through
# json-iterator and the vendored modern-go/reflect2 1.0.1, whose map iteration is broken under Go
# >= 1.18 (the Go this tree is built with): the API server dies with "fatal error: fault" on the first
# pretty-printed object holding a map (a node, a pod). The same goes for `?pretty=true`.
api() {
  local path=$1; shift
  curl -sS --fail --max-time 10 -A wb-k8s-cluster.sh --cacert "$PKI/ca.crt" -H "@$PKI/admin.header" "$@" \
    "$API_URL$path"
}

# ---------------------------------------------------------------------------------------------------
# Images: the pod sandbox ("pause") and a busybox for test pods, both made locally with `docker import`
# (no registry is reachable, and the kubelet would otherwise try to pull k8s.gcr.io/pause). Each carries
# the checksum of what it was made from, so a rebuilt binary gives a new image.

image_current() { [ "$(docker image inspect -f '{{index .Config.Labels "wb.source"}}' "$1" 2>/dev/null)" = "$2" ]; }

# import_image TAG ROOT SUM [--change ...]: the folder ROOT as the whole file system of image TAG.
import_image() {
  local tag=$1 root=$2 sum=$3; shift 3
  log "building image $tag"
  tar -C "$root" -c . | docker import --change "LABEL wb.source=$sum" "$@" - "$tag" >/dev/null
}

make_images() {
  local pause_sum busybox_sum tmp
  pause_sum=$(sha256sum "$BIN/pause" | cut -c1-16)
  busybox_sum=$(sha256sum /bin/busybox | cut -c1-16)-1  # -N: bump when the recipe below changes
  if image_current "$PAUSE_IMAGE" "$pause_sum" && image_current "$BUSYBOX_IMAGE" "$busybox_sum"; then return 0; fi
  tmp=$(mktemp -d /tmp/wb-k8s-img.XXXXXX)
  mkdir -p "$tmp/pause" "$tmp/busybox/bin" "$tmp/busybox/etc" "$tmp/busybox/tmp"
  cp "$BIN/pause" "$tmp/pause/pause"
  import_image "$PAUSE_IMAGE" "$tmp/pause" "$pause_sum" --change 'ENTRYPOINT ["/pause"]'
  # busybox and one link per applet: `sh -c 'echo ...; sleep ...'` and friends, nothing else.
  cp /bin/busybox "$tmp/busybox/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [ "$applet" = busybox ] || ln -s busybox "$tmp/busybox/bin/$applet"
  done
  chmod 1777 "$tmp/busybox/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$tmp/busybox/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$tmp/busybox/etc/group"
  import_image "$BUSYBOX_IMAGE" "$tmp/busybox" "$busybox_sum" --change 'ENV PATH=/bin' --change 'CMD ["sh"]'
  rm -rf "$tmp"
}

# ---------------------------------------------------------------------------------------------------
# The simulated GPUs, from the same function the hub's simulated inventory uses. Prints
#   <count> <MiB per GPU> <product as GFD writes it> <uuid,uuid,...> <mig-PROFILE=N,...|none>
gpu_facts() {
  "$PY" - "$GPUS" "$NODE" <<'EOF'
import sys
from workbench_devices import parse_simulated_spec

# Whole GPUs only: GFD's gpu.count and the nvidia.com/gpu count leave a GPU laid out in MIG slices out;
# its slices are counted per profile (the plugin's nvidia.com/mig-<profile> resources).
devices = parse_simulated_spec(sys.argv[1], sys.argv[2])
gpus = [g for g in devices if not g.mig]
slices = {}
for d in devices:
    if d.mig:
        slices[f"mig-{d.profile}"] = slices.get(f"mig-{d.profile}", 0) + 1
if not gpus:
    sys.exit(f"WB_K8S_GPUS={sys.argv[1]!r} gives no GPUs")
first = gpus[0]
# GFD labels one product per node (the first GPU's); NVML says e.g. "NVIDIA H200", GFD writes
# "NVIDIA-H200". Our name carries " (simulated)", which NVML's would not.
product = first.name.replace(" (simulated)", "").strip().replace(" ", "-")
print(
    len(gpus),
    first.memory_total_bytes // 2**20,
    product,
    ",".join(g.uuid for g in gpus),
    ",".join(f"{k}={n}" for k, n in slices.items()) or "none",
)
EOF
}

# ---------------------------------------------------------------------------------------------------
# sysctls: the kubelet sets vm.overcommit_memory=1, kernel.panic=10 and kernel.panic_on_oops=1 on
# start (a node's defaults). This is someone's machine, not a node: the values from before the first
# kubelet start are saved, and put back as soon as the node is Ready and again on `stop`. The file is
# kept until `stop`, so a session that died with the kubelet's values in place still restores the old.

save_sysctls() {
  [ -s "$STATE/sysctl.saved" ] && return 0
  for key in $SYSCTLS; do echo "$key=$(sysctl -n "$key")"; done >"$STATE/sysctl.saved"
}

restore_sysctls() {
  [ -s "$STATE/sysctl.saved" ] || return 0
  while IFS='=' read -r key value; do
    sysctl -q -w "$key=$value" >/dev/null || log "could not put back $key=$value"
  done <"$STATE/sysctl.saved"
}

# ---------------------------------------------------------------------------------------------------

node_json() { api "/api/v1/nodes/$NODE"; }
# node_ready [SINCE]: Ready, in a status the kubelet posted after SINCE (epoch seconds). The node object
# outlives the kubelet: right after a kubelet restart it still says Ready with the old kubelet's GPUs,
# and the new kubelet's first status has allocatable GPUs 0 until the plugin has registered again.
node_ready() {
  [ "$(node_json | jq -r --argjson since "${1:-0}" '.status.conditions[]? | select(.type == "Ready")
    | if (.lastHeartbeatTime | fromdateiso8601) > $since then .status else "stale" end')" = True ]
}
node_gpus() { node_json | jq -r '.status.allocatable["nvidia.com/gpu"] // "0"'; }
node_has_gpus() { [ "$(node_gpus)" = "$1" ]; }
# node_has RESOURCE N: the node's allocatable RESOURCE (e.g. nvidia.com/mig-1g.18gb) is N.
node_has() { [ "$(node_json | jq -r --arg r "$1" '.status.allocatable[$r] // "0"')" = "$2" ]; }

write_configs() {
  mkdir -p "$STATE/kubelet/pki" "$STATE/etcd" "$RUN" "$LOGS"
  chmod 700 "$STATE/etcd"
  printf 'Authorization: Bearer %s\n' "$(token_of admin)" >"$PKI/admin.header"
  chmod 600 "$PKI/admin.header"
  kubeconfig "$STATE/admin.kubeconfig" admin
  kubeconfig "$STATE/kubelet/kubeconfig" "system:node:$NODE"
  # Written only when different: its checksum decides whether a running kubelet is restarted.
  cat >"$STATE/kubelet/config.yaml.new" <<EOF
# Written by tests/kubernetes/cluster.sh.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
# Docker here uses cgroupfs on cgroup v1.
cgroupDriver: cgroupfs
# Someone's machine: swap may be on, and the kubelet must not touch iptables beyond what Docker does.
failSwapOn: false
makeIPTablesUtilChains: false
# 0, not the default -999: without CAP_SYS_RESOURCE a negative value fails (see build.sh).
oomScoreAdj: 0
# Never delete images (the machine's own are not the kubelet's to collect), and never evict pods
# because the disk is nearly full: a developer's disk often is, and an eviction would read as a test
# failure. (Setting evictionHard replaces all of its defaults, hence the full list.)
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "100Mi"
  nodefs.inodesFree: "1%"
  imagefs.available: "100Mi"
# Report device-plugin changes (allocatable GPUs) within seconds, not the default 10 s.
nodeStatusUpdateFrequency: 4s
# No cluster DNS: pods resolve as the machine does.
resolvConf: /etc/resolv.conf
serializeImagePulls: false
EOF
  if cmp -s "$STATE/kubelet/config.yaml.new" "$STATE/kubelet/config.yaml"; then
    rm -f "$STATE/kubelet/config.yaml.new"
  else
    mv "$STATE/kubelet/config.yaml.new" "$STATE/kubelet/config.yaml"
  fi
}

# The device-plugin API, compiled for the plugin (kept out of the clone; only when the .proto changed).
compile_proto() {
  local proto=$HERE/deviceplugin_v1beta1.proto out=$STATE/proto
  if [ -s "$out/deviceplugin_v1beta1_pb2_grpc.py" ] && [ "$out/deviceplugin_v1beta1_pb2_grpc.py" -nt "$proto" ]; then
    return 0
  fi
  mkdir -p "$out"
  "$PY" -m grpc_tools.protoc -I"$HERE" --python_out="$out" --grpc_python_out="$out" "$proto" \
    || die "compiling $proto failed (is grpcio-tools in $PY's environment?)"
}

cmd_start() {
  local t0; t0=$(date +%s.%N)
  STARTED=()
  need_root
  # One start at a time: CI starts the cluster in the background while the tests' fixture may ask too;
  # the second waits and then finds everything running.
  exec 8>/run/lock/wb-k8s-start.lock
  flock 8
  # build.sh prints the folder holding bin/ (and builds it once, ~10 min, when the cache is empty).
  # The lock: two test runs starting at once on a fresh machine must not build twice side by side.
  local out; out=$(flock /run/lock/wb-k8s-build.lock "$HERE/build.sh") || die "tests/kubernetes/build.sh failed"
  BIN=$out/bin
  docker info >/dev/null 2>&1 || env -u COLUMNS "$REPO/tests/docker/start-dockerd.sh" >&2 8>&- \
    || die "no Docker engine (tests/docker/start-dockerd.sh failed)"
  mkdir -p "$STATE"; chmod 700 "$STATE"
  make_pki
  write_configs
  make_images
  compile_proto
  local facts count mib product uuids slices
  facts=$(gpu_facts) || die "cannot work out the simulated GPUs from WB_K8S_GPUS=$GPUS"
  read -r count mib product uuids slices <<<"$facts"

  launch etcd "" /usr/bin/etcd --name wbk8s --data-dir "$STATE/etcd" \
    --listen-client-urls "http://$ETCD_CLIENT" --advertise-client-urls "http://$ETCD_CLIENT" \
    --listen-peer-urls "http://$ETCD_PEER" --initial-advertise-peer-urls "http://$ETCD_PEER" \
    --initial-cluster "wbk8s=http://$ETCD_PEER" --logger zap --log-level warn
  wait_for etcd 30 "etcd on $ETCD_CLIENT" curl -sf --max-time 2 "http://$ETCD_CLIENT/health" || exit 1

  # The requestheader (front proxy) flags only quiet the controller manager and scheduler, which look
  # for that CA every few seconds and log its absence: no front-proxy-client certificate is ever made.
  # No endpoint reconciler: it would publish 127.0.0.1 as the `kubernetes` service's endpoint, which
  # Endpoints validation rejects (loopback) every 10 s. Nothing here reaches the API through a service.
  launch kube-apiserver "" "$BIN/kube-apiserver" \
    --etcd-servers "http://$ETCD_CLIENT" \
    --bind-address 127.0.0.1 --secure-port "$API_PORT" --insecure-port 0 --advertise-address 127.0.0.1 \
    --endpoint-reconciler-type none \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" --token-auth-file "$PKI/tokens.csv" --anonymous-auth=false \
    --requestheader-client-ca-file "$PKI/ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --authorization-mode Node,RBAC \
    --service-cluster-ip-range "$SERVICE_RANGE" \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --profiling=false
  wait_for kube-apiserver 90 "the API server to be ready" api /readyz || exit 1

  launch kube-controller-manager "" "$BIN/kube-controller-manager" \
    --kubeconfig "$STATE/admin.kubeconfig" \
    --authentication-kubeconfig "$STATE/admin.kubeconfig" --authorization-kubeconfig "$STATE/admin.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$CM_PORT" --port 0 --leader-elect=false \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --service-cluster-ip-range "$SERVICE_RANGE" --cluster-name wbk8s --profiling=false
  launch kube-scheduler "" "$BIN/kube-scheduler" \
    --kubeconfig "$STATE/admin.kubeconfig" \
    --authentication-kubeconfig "$STATE/admin.kubeconfig" --authorization-kubeconfig "$STATE/admin.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --port 0 --leader-elect=false --profiling=false

  if ! alive kubelet; then save_sysctls; fi
  launch kubelet "$STATE/kubelet/config.yaml" "$BIN/kubelet" \
    --config "$STATE/kubelet/config.yaml" --kubeconfig "$STATE/kubelet/kubeconfig" \
    --root-dir "$KUBELET_ROOT" --cert-dir "$STATE/kubelet/pki" \
    --container-runtime docker --docker-endpoint unix:///var/run/docker.sock \
    --pod-infra-container-image "$PAUSE_IMAGE" \
    --hostname-override "$NODE" --node-ip "$NODE_IP"
  # The spec is on its command line: a changed WB_K8S_GPUS restarts the plugin and it registers anew.
  launch device-plugin "" "$PY" "$HERE/device_plugin.py" --spec "$GPUS" --node "$NODE" --proto-dir "$STATE/proto"
  launch provisioner "" "$PY" "$HERE/provisioner.py" --kubeconfig "$STATE/admin.kubeconfig" --root "$STATE/volumes"

  wait_for kube-controller-manager 30 "the controller manager's healthz" \
    curl -skf --max-time 2 "https://127.0.0.1:$CM_PORT/healthz" || exit 1
  wait_for kube-scheduler 30 "the scheduler's healthz" \
    curl -skf --max-time 2 "https://127.0.0.1:$SCHED_PORT/healthz" || exit 1
  if ! wait_for kubelet 90 "node $NODE to be Ready" node_ready "$(cat "$RUN/kubelet.started")"; then
    restore_sysctls; exit 1
  fi
  restore_sysctls

  # What GPU Feature Discovery would label (a merge patch: the node's other labels stay).
  api "/api/v1/nodes/$NODE" -X PATCH -H 'Content-Type: application/merge-patch+json' \
    --data "{\"metadata\":{\"labels\":{\"nvidia.com/gpu.product\":\"$product\",\"nvidia.com/gpu.memory\":\"$mib\",\"nvidia.com/gpu.count\":\"$count\"}}}" \
    >/dev/null || die "labelling node $NODE failed"
  if ! wait_for device-plugin 60 "node $NODE to advertise nvidia.com/gpu=$count" node_has_gpus "$count"; then
    log "node $NODE has nvidia.com/gpu=$(node_gpus 2>/dev/null || echo ?); end of $LOGS/kubelet.log:"
    grep -iE 'device|plugin|nvidia' "$LOGS/kubelet.log" | tail -15 >&2 || true
    exit 1
  fi
  local item
  for item in ${slices//,/ }; do
    [ "$item" = none ] && continue
    wait_for device-plugin 60 "node $NODE to advertise nvidia.com/${item}" node_has "nvidia.com/${item%=*}" "${item#*=}" \
      || exit 1
  done

  local what="already running"
  [ ${#STARTED[@]} -eq 0 ] || what="started ${STARTED[*]}"
  log "up in $(awk -v t0="$t0" -v t1="$(date +%s.%N)" 'BEGIN {printf "%.1f", t1 - t0}') s ($what): node $NODE Ready, nvidia.com/gpu=$count ($product, ${mib} MiB): $uuids; MIG slices: $slices"
  log "KUBECONFIG=$STATE/admin.kubeconfig"
}

cmd_stop() {
  local name
  for name in provisioner device-plugin kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do halt "$name"; done
  # With the kubelet gone nothing recreates them: the pods' containers (dockershim names them k8s_*).
  if docker info >/dev/null 2>&1; then
    local ids; ids=$(docker ps -aq --filter name='^/?k8s_')
    if [ -n "$ids" ]; then
      # shellcheck disable=SC2086  # one id per word
      docker rm -f $ids >/dev/null || log "could not remove every k8s_ container"
    fi
  fi
  # The pods' volumes (secret and emptyDir tmpfs mounts), deepest first, and last the kubelet's bind
  # mount of its root folder onto itself (it makes that folder a shared mount; the next one does again).
  awk -v root="$KUBELET_ROOT" '$5 == root || index($5, root "/") == 1 {print $5}' /proc/self/mountinfo |
    sort -r | while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" || log "could not unmount $m"
    done
  rm -f "$KUBELET_ROOT"/device-plugins/*.sock
  # Sandbox checkpoints and logs of pods whose containers are gone: a later kubelet would only chase them.
  rm -rf /var/lib/dockershim/sandbox /var/log/pods/* /var/log/containers/*.log
  # The kubelet's QoS cgroups, now empty, in every hierarchy.
  for d in /sys/fs/cgroup/*/kubepods; do
    if [ -d "$d" ]; then find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
  restore_sysctls
  rm -f "$STATE/sysctl.saved"
  log "stopped"
}

# An API server outage for tests (tests/kubernetes/test_kubernetes_outage.py): only kube-apiserver stops;
# etcd, the controller manager, the scheduler, the kubelet and its pods keep running, as on a real cluster
# whose control plane is away. `api-start` (or `start`) brings it back.
cmd_api_stop() {
  need_root
  exec 8>/run/lock/wb-k8s-start.lock
  flock 8
  alive kube-apiserver || { log "the API server is not running"; return 0; }
  halt kube-apiserver
  log "API server stopped; etcd, the node and its pods run on (\`$0 api-start\` brings it back)"
}

cmd_status() {
  [ -s "$PKI/admin.header" ] || { log "not started ($STATE has no credentials)"; return 1; }
  api /readyz >/dev/null 2>&1 || { log "the API server does not answer at $API_URL"; return 1; }
  node_ready 0 2>/dev/null || { log "node $NODE is not Ready"; return 1; }
  local gpus; gpus=$(node_gpus 2>/dev/null || echo 0)
  [ "${gpus:-0}" -gt 0 ] 2>/dev/null || { log "node $NODE advertises no nvidia.com/gpu"; return 1; }
  log "up: node $NODE Ready, nvidia.com/gpu=$gpus; KUBECONFIG=$STATE/admin.kubeconfig"
}

case "${1:-start}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  api-stop) cmd_api_stop ;;
  api-start) cmd_start ;;
  *) echo "usage: $0 start|stop|status|api-stop|api-start" >&2; exit 2 ;;
esac
