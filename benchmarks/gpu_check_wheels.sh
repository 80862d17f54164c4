#!/usr/bin/env bash
# Download, here, the wheels benchmarks/gpu_check.sh needs on the nvidia-h200 device machine, into
# .whl/ at the repo root (ignored through .git/info/exclude; never commit them).
#
# That machine (the device tool's KINDS.md) has Python 3.12 with torch, nvidia-ml-py, requests, psutil
# and more, but no Jupyter: this fetches jupyter_server, jupyter_client, ipykernel, nbclient and
# nbformat with everything they need (cp312, manylinux x86-64, the versions this checkout's .venv
# runs), drops what the machine already has, and adds jupyterlab-nvdashboard without its
# requirements (its server extension needs only jupyter_server, tornado and nvidia-ml-py).
# About 15 MiB; the device tool carries 64 MiB a call.
#
# Then:  run(command='python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
#        --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit;
#        benchmarks/gpu_check.sh "$OUT"', carry=[".whl"], timeout_s=560)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
mkdir -p .git/info
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir .whl
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64
           --platform manylinux2010_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
COMMON=(--only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" -d .whl)
"$PYTHON" -m pip download -q "${COMMON[@]}" \
    jupyter_server==2.21.1 jupyter_client==8.10.0 ipykernel==7.4.0 nbclient==0.11.0 nbformat==5.11.1
"$PYTHON" -m pip download -q --no-deps "${COMMON[@]}" jupyterlab-nvdashboard==0.15.0

# Already on the machine (KINDS.md, "Python packages already there", read 2026-11-17): one version
# of each is what pip's --target install needs, and these are the machine's own.
ON_DEVICE="anyio attrs certifi charset-normalizer click idna jinja2 markupsafe packaging pip psutil pygments
python-dateutil pyyaml prometheus-client requests setuptools six typing-extensions urllib3 wheel h11 httpx httpcore
filelock fsspec tqdm"
for w in .whl/*.whl; do
    name="$(basename "$w" | cut -d- -f1 | tr 'A-Z_.' 'a-z--')"
    for have in $ON_DEVICE; do
        [ "$name" = "$have" ] && { rm -f "$w"; break; }
    done
done
ls .whl
du -sh .whl
