#!/usr/bin/env bash
# Build gpu-workbench/singleuser:test and gpu-workbench/hub:test from the real
# Dockerfiles on a machine with no container registry (`make test-images`).
#
#   images/build-test-images.sh [all|base|wheelhouse|chp|singleuser|hub]...
#
# Steps (each cached, so a second run with unchanged inputs takes seconds):
#   base        debootstrap --variant=minbase bookworm (python3, venv, pip, nodejs)
#               and `docker import` as gpu-workbench/base:bookworm (~90 s cold).
#   wheelhouse  every wheel both images need, made on the host (pip inside the
#               containers cannot verify TLS here) in .cache/wheelhouse, plus the
#               workbench-devices wheel built from devices/ (both images) and the
#               workbench-gpu-monitor wheel built from extensions/gpu-monitor
#               (single-user image only).
#   chp         configurable-http-proxy and its npm dependencies, installed on the
#               host into .cache/chp (copied into the hub image).
#   singleuser  docker build -f images/singleuser/Dockerfile with the base and the
#   hub         wheelhouse swapped in by build args (BASE_IMAGE, WHEELHOUSE, CHP_DIR).
#
# Cache: the base image and both test images carry a label
# `workbench.input-hash`; a step is skipped when the tag exists and the hash of
# its inputs (Dockerfile, copied sources, wheelhouse listing, base image id) is
# unchanged. The wheelhouse records its input hash in .cache/wheelhouse/.input-hash.
#
# Environment:
#   WORKBENCH_CACHE_DIR        default <repo>/.cache
#   WORKBENCH_DEBIAN_MIRROR    default http://deb.debian.org/debian
#   WORKBENCH_ALLOW_NO_MONITOR=1  build the images without the GPU monitor wheel
#                              if extensions/gpu-monitor cannot be built (warns)
#   WORKBENCH_FORCE_REBUILD=1  ignore the caches
#   PYTHON                     host python used for pip wheel (default python3)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${WORKBENCH_CACHE_DIR:-$repo/.cache}"
mirror="${WORKBENCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
python="${PYTHON:-}"   # chosen in pick_python
force="${WORKBENCH_FORCE_REBUILD:-0}"

BASE_TAG=gpu-workbench/base:bookworm
SINGLEUSER_TAG=gpu-workbench/singleuser:test
HUB_TAG=gpu-workbench/hub:test
BASE_PACKAGES="python3,python3-venv,python3-pip,ca-certificates,nodejs"
CHP_VERSION="$(sed -n 's/^ARG CHP_VERSION=//p' "$repo/images/hub/Dockerfile")"

log() { printf '[build-test-images %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# sha256 over the relative paths and contents of the given files/directories
# (relative to the repo), ignoring build droppings.
hash_paths() {
    (
        cd "$repo"
        for p in "$@"; do
            [ -e "$p" ] || { echo "missing:$p"; continue; }
            # the same exclusions as .dockerignore
            find "$p" \( -name __pycache__ -o -name '*.pyc' -o -name '*.egg-info' \
                -o -name .ipynb_checkpoints -o -name '*.tsbuildinfo' \
                -o -path 'extensions/gpu-monitor/node_modules' -o -path 'extensions/gpu-monitor/lib' \
                -o -path 'extensions/gpu-monitor/workbench_gpu_monitor/labextension' \
                -o -path 'extensions/gpu-monitor/workbench_gpu_monitor/_version.py' \
                -o -path 'devices/dist' -o -path 'extensions/gpu-monitor/dist' \) -prune \
                -o -type f -print
        done | LC_ALL=C sort | while IFS= read -r f; do
            printf '%s %s\n' "$f" "$(sha256sum < "$f" | cut -c1-64)"
        done
    ) | sha256sum | cut -c1-64
}

image_label() { # image label -> value or empty
    docker image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true
}

up_to_date() { # tag hash
    [ "$force" != 1 ] && [ "$(image_label "$1" workbench.input-hash)" = "$2" ]
}

# ---------------------------------------------------------------- base image
unmount_under() { # dir: unmount anything mounted below it (deepest first)
    [ -d "$1" ] || return 0
    local d; d="$(cd "$1" && pwd -P)"
    awk -v d="$d/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
}

build_base() {
    local h
    h="$(printf 'v1 bookworm minbase %s %s\n' "$BASE_PACKAGES" "$mirror" | sha256sum | cut -c1-64)"
    if up_to_date "$BASE_TAG" "$h"; then
        log "base: $BASE_TAG up to date"
        return
    fi
    command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
    local root="$cache/debootstrap-root"
    unmount_under "$root"
    rm -rf --one-file-system "$root"
    mkdir -p "$root"
    log "base: debootstrap bookworm from $mirror (about 90 s)"
    local t0=$SECONDS
    debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$root" "$mirror" \
        > "$cache/debootstrap.log" 2>&1 || { tail -n 30 "$cache/debootstrap.log" >&2; die "debootstrap failed"; }
    unmount_under "$root"   # debootstrap mounts proc/sys inside the root
    # Slim down: apt lists, caches, docs; no services may start inside the image.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
        "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
    printf 'deb %s bookworm main\n' "$mirror" > "$root/etc/apt/sources.list"
    tar -C "$root" --one-file-system -c . | docker import \
        --change "LABEL workbench.input-hash=$h" \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' \
        - "$BASE_TAG" >/dev/null
    rm -rf --one-file-system "$root"
    log "base: $BASE_TAG built in $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------- wheelhouse
# A pure-Python package of ours (no node build), built once per source hash into
# .cache/<name>-wheel/<hash>/, like the monitor below; older hashes are removed.
build_pure_wheel() { # DIR DIST_NAME WHAT -> prints the wheel path
    local dir="$1" dist="$2" what="$3" name h out
    name="$(basename "$dir")"
    [ -f "$repo/$dir/pyproject.toml" ] || die "$dir/pyproject.toml missing ($what)"
    h="$(hash_paths "$dir")"
    out="$cache/$name-wheel/$h"
    if ! ls "$out"/"$dist"-*.whl >/dev/null 2>&1; then
        log "wheelhouse: building ${dist//_/-} wheel"
        rm -rf "$out"; mkdir -p "$out"
        "$python" -m pip wheel --no-deps --wheel-dir "$out" "$repo/$dir" > "$cache/$name-wheel.log" 2>&1 \
            || { tail -n 30 "$cache/$name-wheel.log" >&2; rm -rf "$out"; die "building $dir failed (log: $cache/$name-wheel.log)"; }
        find "$cache/$name-wheel" -mindepth 1 -maxdepth 1 ! -name "$h" -exec rm -rf {} +
    fi
    ls "$out"/"$dist"-*.whl | head -n1
}

# The GPU monitor wheel is not byte-reproducible (timestamps), so it is built
# once per source hash and kept in .cache/monitor-wheel/<hash>/.
build_monitor_wheel() { # -> prints the wheel path or nothing
    local src="$repo/extensions/gpu-monitor" h out
    if [ ! -f "$src/pyproject.toml" ]; then
        [ "${WORKBENCH_ALLOW_NO_MONITOR:-0}" = 1 ] || die "extensions/gpu-monitor/pyproject.toml missing (set WORKBENCH_ALLOW_NO_MONITOR=1 to build without the monitor)"
        log "wheelhouse: WARNING: extensions/gpu-monitor has no pyproject.toml; images get no GPU monitor"
        return 0
    fi
    h="$(hash_paths extensions/gpu-monitor)"
    out="$cache/monitor-wheel/$h"
    if ! ls "$out"/workbench_gpu_monitor-*.whl >/dev/null 2>&1; then
        log "wheelhouse: building workbench-gpu-monitor wheel (fresh JupyterLab build of src/)"
        rm -rf "$out"; mkdir -p "$out"
        # Build in a copy: pip builds in-tree, and the extension's build writes lib/
        # and the labextension (a stale prebuilt one would be packaged as it is).
        local work="$cache/monitor-src"
        rm -rf "$work"; mkdir -p "$work"
        tar -C "$src" --exclude=./lib --exclude=./workbench_gpu_monitor/labextension \
            --exclude='*.tsbuildinfo' --exclude=__pycache__ --exclude='*.egg-info' -c . | tar -C "$work" -x
        if ! "$python" -m pip wheel --no-deps --wheel-dir "$out" "$work" > "$cache/monitor-wheel.log" 2>&1; then
            tail -n 30 "$cache/monitor-wheel.log" >&2
            if [ "${WORKBENCH_ALLOW_NO_MONITOR:-0}" != 1 ]; then
                rm -rf "$out" "$work"
                die "building extensions/gpu-monitor failed (log: $cache/monitor-wheel.log; WORKBENCH_ALLOW_NO_MONITOR=1 builds without its frontend)"
            fi
            # Fallback: the Python package only (server extension, NVML sampler),
            # without the JupyterLab frontend: build hooks off.
            log "wheelhouse: WARNING: gpu-monitor frontend failed to build; using a Python-only wheel (no JupyterLab extension)"
            rm -rf "$out"; mkdir -p "$out"
            if ! HATCH_BUILD_NO_HOOKS=true "$python" -m pip wheel --no-deps --wheel-dir "$out" "$work" >> "$cache/monitor-wheel.log" 2>&1; then
                rm -rf "$out" "$work"
                log "wheelhouse: WARNING: gpu-monitor does not build at all; images get no GPU monitor"
                return 0
            fi
            # not cached under the source hash: retried on the next run
            mkdir -p "$cache/monitor-wheel/python-only"
            rm -f "$cache/monitor-wheel/python-only"/*.whl
            mv "$out"/*.whl "$cache/monitor-wheel/python-only/"; rm -rf "$out" "$work"
            out="$cache/monitor-wheel/python-only"
        fi
        rm -rf "$work"
        # drop wheels of older sources
        find "$cache/monitor-wheel" -mindepth 1 -maxdepth 1 ! -name "$h" -exec rm -rf {} +
    fi
    ls "$out"/workbench_gpu_monitor-*.whl | head -n1
}

pip_logged() { # run pip, output to .cache/wheelhouse.log, its tail on failure
    "$@" >> "$cache/wheelhouse.log" 2>&1 || { tail -n 30 "$cache/wheelhouse.log" >&2; die "failed: $*"; }
}

# The wheels are resolved on the host for the containers' Python: the host
# interpreter must have the base image's exact version (Requires-Python
# markers such as ">=3.11.5" differ between 3.11.2 and 3.11.7). Debian 12's
# /usr/bin/python3 matches the bookworm base.
pick_python() {
    [ -n "$python" ] && [ "$python" != auto ] && return
    local want cand
    want="$(docker run --rm "$BASE_TAG" python3 -c 'import platform; print(platform.python_version())')"
    for cand in ${PYTHON:+"$PYTHON"} /usr/bin/python3 python3 "python${want%.*}"; do
        if command -v "$cand" >/dev/null 2>&1 \
            && [ "$("$cand" -c 'import platform; print(platform.python_version())' 2>/dev/null)" = "$want" ] \
            && "$cand" -m pip --version >/dev/null 2>&1; then
            python="$cand"; log "wheelhouse: host python $cand ($want, as in $BASE_TAG)"; return
        fi
    done
    die "no host python $want with pip (the base image's version); set PYTHON=/path/to/python$want"
}

build_wheelhouse() {
    local wh="$cache/wheelhouse" devices monitor ssh h tmp t0=$SECONDS
    mkdir -p "$cache"
    pick_python
    devices="$(build_pure_wheel devices workbench_devices "workbench-devices, the GPU inventory both images need")"
    monitor="$(build_monitor_wheel)"
    ssh="$(build_pure_wheel extensions/ssh workbench_ssh "workbench-ssh, the single-user image's SSH server")"
    # The third-party wheels depend on the requirement files, the pyprojects and
    # the Python version, not on our own packages' code: when only that changed,
    # their wheels are swapped in place (a full rebuild takes minutes).
    # (images/hub/Dockerfile names the extras the hub installs, so a new extra brings its wheels in.)
    local inputs=(images/singleuser/requirements.txt images/hub/requirements.txt requirements/lock.txt
                  devices/pyproject.toml extensions/gpu-monitor/pyproject.toml extensions/ssh/pyproject.toml
                  images/hub/Dockerfile)
    [ -f "$repo/pyproject.toml" ] && inputs+=(pyproject.toml)
    h="$( { hash_paths "${inputs[@]}"; echo "monitor:${monitor:+yes}"; "$python" -V; } | sha256sum | cut -c1-64)"
    if [ "$force" != 1 ] && [ -f "$wh/.input-hash" ] && [ "$(cat "$wh/.input-hash")" = "$h" ]; then
        local own
        for own in "$devices" "$monitor" "$ssh"; do
            [ -n "$own" ] || continue
            if ! cmp -s "$own" "$wh/${own##*/}"; then
                rm -f "$wh/${own##*/}"
                cp "$own" "$wh/"
                log "wheelhouse: swapped in the new ${own##*/}"
            fi
        done
        log "wheelhouse: $wh up to date ($(ls "$wh" | wc -l) files)"
        return
    fi
    log "wheelhouse: building $wh"
    tmp="$cache/wheelhouse.new"
    rm -rf "$tmp"; mkdir -p "$tmp"
    # our own wheels first: the monitor's and the hub's requirements name them
    cp "$devices" "$ssh" "$tmp/"
    [ -n "$monitor" ] && cp "$monitor" "$tmp/"
    # exact versions from the one lock file, as the Dockerfiles install them
    local pipw=(pip_logged "$python" -m pip wheel --wheel-dir "$tmp" --find-links "$tmp" -c "$repo/requirements/lock.txt")
    : > "$cache/wheelhouse.log"
    # single-user image: its requirements (+ the monitor's dependencies)
    "${pipw[@]}" -r "$repo/images/singleuser/requirements.txt" ${monitor:+"$monitor"} "$ssh"
    # hub image: the hub distribution's dependencies and its build backend, so
    # `pip install --no-index --find-links` can build it from source in the image
    "${pipw[@]}" -r "$repo/images/hub/requirements.txt"
    if [ -f "$repo/pyproject.toml" ]; then
        # its build backend and its dependencies (not the project itself: the
        # image builds it from the copied source)
        "$python" - "$repo/pyproject.toml" > "$cache/hub-requires.txt" <<'PY'
import sys, tomllib
data = tomllib.load(open(sys.argv[1], "rb"))
reqs = data.get("build-system", {}).get("requires", ["setuptools>=40.8.0", "wheel"])
reqs += data.get("project", {}).get("dependencies", [])
# the hub image installs "/srv/workbench[docker,kubernetes,postgres]" (the Docker and Kubernetes backends;
# psycopg for a PostgreSQL WORKBENCH_DB_URL)
for extra in ("docker", "kubernetes", "postgres"):
    reqs += data.get("project", {}).get("optional-dependencies", {}).get(extra, [])
print("\n".join(reqs))
PY
        "${pipw[@]}" -r "$cache/hub-requires.txt"
    else
        log "wheelhouse: WARNING: no root pyproject.toml yet; hub wheelhouse has only images/hub/requirements.txt"
    fi
    echo "$h" > "$tmp/.input-hash"
    rm -rf "$wh"; mv "$tmp" "$wh"
    log "wheelhouse: $(ls "$wh" | wc -l) wheels in $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------- CHP (npm)
build_chp() {
    local dir="$cache/chp"
    if [ "$force" != 1 ] && [ -x "$dir/node_modules/.bin/configurable-http-proxy" ] \
        && [ "$(cat "$dir/.version" 2>/dev/null)" = "$CHP_VERSION" ]; then
        log "chp: configurable-http-proxy $CHP_VERSION up to date"
        return
    fi
    command -v npm >/dev/null || die "npm not found on the host (needed to prepare configurable-http-proxy)"
    log "chp: npm install configurable-http-proxy@$CHP_VERSION into $dir"
    rm -rf "$dir"; mkdir -p "$dir"
    (cd "$dir" && echo '{"name":"workbench-chp","private":true}' > package.json \
        && npm install --no-audit --no-fund --omit=dev --loglevel=error "configurable-http-proxy@$CHP_VERSION" >/dev/null)
    echo "$CHP_VERSION" > "$dir/.version"
}

# ---------------------------------------------------------------- images
docker_build() { # tag dockerfile hash [build args...]
    local tag=$1 dockerfile=$2 h=$3 t0=$SECONDS old; shift 3
    old="$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
    log "build: $tag from $dockerfile"
    # The legacy builder is used on purpose: Debian's docker.io ships without
    # buildx, and it needs nothing from a registry for these Dockerfiles.
    DOCKER_BUILDKIT=0 docker build --quiet --force-rm -f "$repo/$dockerfile" -t "$tag" \
        --label "workbench.input-hash=$h" \
        --build-arg "BASE_IMAGE=$BASE_TAG" \
        --build-arg "WHEELHOUSE=.cache/wheelhouse" \
        "$@" "$repo" >/dev/null 2>"$cache/build-${tag//[\/:]/_}.log" \
        || { tail -n 40 "$cache/build-${tag//[\/:]/_}.log" >&2; die "docker build $tag failed"; }
    log "build: $tag built in $((SECONDS - t0)) s"
    # the previous build of this tag, now untagged: remove it unless still in use
    if [ -n "$old" ] && [ "$(docker image inspect --format '{{len .RepoTags}}' "$old" 2>/dev/null)" = 0 ]; then
        docker rmi "$old" >/dev/null 2>&1 || true
    fi
}

wheelhouse_listing() { (cd "$cache/wheelhouse" && ls | LC_ALL=C sort | while read -r f; do echo "$f $(sha256sum < "$f" | cut -c1-64)"; done) }
# the hub installs no GPU monitor: a new monitor wheel alone does not rebuild it
hub_wheelhouse_listing() { wheelhouse_listing | grep -v -e '^workbench_gpu_monitor-' -e '^workbench_ssh-' || true; }

build_singleuser() {
    local h
    h="$( { hash_paths images/singleuser requirements/lock.txt notebooks devices extensions/gpu-monitor extensions/ssh .dockerignore; wheelhouse_listing;
            docker image inspect --format '{{.Id}}' "$BASE_TAG"; } | sha256sum | cut -c1-64)"
    if up_to_date "$SINGLEUSER_TAG" "$h"; then log "build: $SINGLEUSER_TAG up to date"; return; fi
    docker_build "$SINGLEUSER_TAG" images/singleuser/Dockerfile "$h"
}

build_hub() {
    [ -f "$repo/pyproject.toml" ] || die "hub: root pyproject.toml missing (the hub distribution); cannot build $HUB_TAG yet"
    local h
    h="$( { hash_paths images/hub requirements/lock.txt pyproject.toml README.md hub spawner devices .dockerignore; hub_wheelhouse_listing;
            cat "$cache/chp/.version"; docker image inspect --format '{{.Id}}' "$BASE_TAG"; } | sha256sum | cut -c1-64)"
    if up_to_date "$HUB_TAG" "$h"; then log "build: $HUB_TAG up to date"; return; fi
    docker_build "$HUB_TAG" images/hub/Dockerfile "$h" --build-arg "CHP_DIR=.cache/chp"
}

docker info >/dev/null 2>&1 || die "no Docker Engine answers (start one with tests/docker/start-dockerd.sh)"
mkdir -p "$cache"
# One build at a time per cache (pytest fixtures and `make test-images` may overlap).
exec 9>"$cache/.build.lock"
flock 9 || die "cannot lock $cache/.build.lock"
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(all)
for step in "${steps[@]}"; do
    case "$step" in
        all) build_base; build_wheelhouse; build_chp; build_singleuser; build_hub ;;
        base) build_base ;;
        wheelhouse) build_wheelhouse ;;
        chp) build_chp ;;
        singleuser) build_base; build_wheelhouse; build_singleuser ;;
        hub) build_base; build_wheelhouse; build_chp; build_hub ;;
        *) die "unknown step $step (all|base|wheelhouse|chp|singleuser|hub)" ;;
    esac
done
