#!/usr/bin/env bash
# Build the Kubernetes 1.20 binaries the `kubernetes` tests run, once per Debian version.
#
#   tests/kubernetes/build.sh          # prints the folder holding bin/ (building it when missing)
#
# No ready-made API server, kubelet, kind or k3s is in any registry this project may use, but
# Debian's `kubernetes` *source* package (1.20.x, Go dependencies vendored) builds offline with
# Debian's Go 1.19. The build (about 10 minutes cold on 2 cores) lands in a cache folder outside the
# clone, WORKBENCH_K8S_CACHE (default /var/cache/gpu-workbench/kubernetes), one folder per Debian
# version and recipe, so a CI rerun on the same machine reuses it and a new Debian upload rebuilds.
#
# The kubelet is built with two constants set to 0: dockershim's sandbox `oom_score_adj` (-998) and
# the Guaranteed QoS class's (-997). Processes in this sandbox lack CAP_SYS_RESOURCE, so a negative
# oom_score_adj makes runc fail every container ("can't get final child's PID from pipe: EOF").
# Nothing else is changed; a real cluster's kubelet needs neither change.
#
# One vendored library is swapped for Debian's newer copy: github.com/modern-go/reflect2 1.0.1 (the
# tree's) reaches into the Go runtime's map iterator with the signature Go had before 1.18, and with
# Debian's Go 1.19 every json-iterator encoding of a map crashes ("fatal error: fault" in
# UnsafeMapType.UnsafeIterate). The API server pretty-prints with json-iterator for curl, wget and
# `?pretty=true`, so one `curl` of a node killed it. 1.0.2 (golang-github-modern-go-reflect2-dev)
# is the upstream fix, the same API.
set -euo pipefail

CACHE=${WORKBENCH_K8S_CACHE:-/var/cache/gpu-workbench/kubernetes}
# Bump when what this script does to the tree changes, so the cache is rebuilt.
RECIPE=2
MIRROR=${WORKBENCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=${WORKBENCH_DEBIAN_SUITE:-bookworm}
BINS="kube-apiserver kube-controller-manager kube-scheduler kubelet"

log() { echo "build.sh: $*" >&2; }

if [ "$(id -u)" != 0 ]; then log "must run as root (apt-get installs Go and etcd)"; exit 2; fi

need=()
for pkg in golang-1.19-go golang-github-modern-go-reflect2-dev etcd-server etcd-client dpkg-dev gcc libc6-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# A private sources list with a deb-src line for the mirror apt already uses: the machine's own
# apt configuration is left as it is.
apt_dir=$(mktemp -d /tmp/wb-k8s-apt.XXXXXX)
trap 'rm -rf "$apt_dir"' EXIT
mkdir -p "$apt_dir/lists/partial"
echo "deb-src $MIRROR $SUITE main" >"$apt_dir/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$apt_dir/lists" -o "Debug::NoDropPrivs=true")
apt-get -qq "${apt_opts[@]}" update 2>&1 | grep -v "unsandboxed as root" >&2 || true
version=$(apt-cache "${apt_opts[@]}" showsrc kubernetes 2>/dev/null | awk '/^Version:/ {print $2}' | sort -V | tail -1)
if [ -z "$version" ]; then log "no kubernetes source package found at $MIRROR $SUITE"; exit 1; fi

out="$CACHE/${version//[^A-Za-z0-9.+_-]/_}-r$RECIPE"
if [ -f "$out/.built" ]; then
  echo "$out"
  exit 0
fi

log "building Kubernetes $version into $out (about 10 minutes cold on 2 cores)"
work="$CACHE/.work-$$"
rm -rf "$work"
mkdir -p "$work"
(cd "$work" && apt-get -qq "${apt_opts[@]}" source --download-only "kubernetes=$version" >/dev/null 2>&1)
dpkg-source -x "$work"/kubernetes_*.dsc "$work/src" >/dev/null
src="$work/src"

# The two oom_score_adj constants (see the top of this file); fail loudly if the tree moved them.
patch_const() {
  local file=$1 name=$2
  grep -qE "^\s*$name int = -[0-9]+" "$src/$file" || { log "$name not found in $file"; exit 1; }
  sed -i -E "s/^(\s*$name int = )-[0-9]+/\10/" "$src/$file"
}
patch_const pkg/kubelet/dockershim/docker_sandbox.go defaultSandboxOOMAdj
patch_const pkg/kubelet/qos/policy.go guaranteedOOMScoreAdj

# reflect2 (see the top of this file): only where the tree still vendors 1.0.1.
if grep -qE '^# github.com/modern-go/reflect2 (.* )?v1\.0\.1$' "$src/vendor/modules.txt"; then
  r2=$src/vendor/github.com/modern-go/reflect2
  rm -f "$r2"/*.go "$r2"/*.s
  cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.go /usr/share/gocode/src/github.com/modern-go/reflect2/*.s "$r2/"
else
  log "the tree does not vendor modern-go/reflect2 v1.0.1: left as it is"
fi

# As Debian's rules do: a GOPATH whose k8s.io/kubernetes is the tree itself, no modules, no proxy.
mkdir -p "$src/.go/src/k8s.io"
ln -s ../../.. "$src/.go/src/k8s.io/kubernetes"
what=""
for b in $BINS; do what="$what cmd/$b"; done
(
  cd "$src"
  export PATH="/usr/lib/go-1.19/bin:$PATH" GOPATH="$src/.go" HOME="$work" \
    GO111MODULE=off GOPROXY=off GOFLAGS=-mod=vendor CGO_ENABLED=0
  unset GOFLAGS
  make WHAT="${what# }" KUBE_BUILD_PLATFORMS=linux/amd64 GOLDFLAGS="-s -w" >"$work/make.log" 2>&1 \
    || { tail -40 "$work/make.log" >&2; exit 1; }
)

mkdir -p "$work/out/bin"
for b in $BINS; do cp "$src/_output/local/bin/linux/amd64/$b" "$work/out/bin/"; done
# The pod sandbox ("pause") binary from the same tree, static, for an image built at cluster start.
gcc -Os -static -Wall -o "$work/out/bin/pause" "$src/build/pause/linux/pause.c"
cp "$src/LICENSE" "$work/out/LICENSE"
echo "$version" >"$work/out/VERSION"
rm -rf "$out"
mkdir -p "$CACHE"
mv "$work/out" "$out"
touch "$out/.built"
rm -rf "$work"
log "built $(cat "$out/VERSION") into $out"
echo "$out"
