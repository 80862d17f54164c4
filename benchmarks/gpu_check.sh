#!/usr/bin/env bash
# One prepared run that checks, on a real GPU, what CI cannot (issue 15): in under 8 minutes on
# one H200, everything written under $OUT (or the directory given as the first argument).
#
#   benchmarks/gpu_check.sh [OUTDIR]               real run: needs a CUDA GPU, nvidia-smi, NVML
#   benchmarks/gpu_check.sh --dry-run OUTDIR       no GPU: simulated source, fake nvidia-smi (labelled
#   GPU_CHECK_DRY=1 benchmarks/gpu_check.sh OUTDIR   SIMULATED), CPU matmul, 1 client, notebook 00 quick;
#                                                  summary.md says "DRY RUN — simulated, not measurements"
# Steps, each in a time box (timeout) inside an overall budget, so a hung step cannot eat the lease:
#   versions       machine, driver, CUDA, torch, packages                                  (box 30 s)
#   inventory      workbench_devices.nvml_devices()/discover_devices() against nvidia-smi -q:
#                  UUID, name, memory total, MIG mode, field by field                      (box 45 s)
#   kernel_memory  workbench_gpu_monitor.kernel.torch_memory() against torch.cuda.memory_stats(),
#                  in process and in a real ipykernel over the control channel            (box 90 s)
#   monitor        Sampler + NVML source vs nvidia-smi --query-gpu at the same times, 60 s bf16
#                  matmul load then 20 s idle                                             (box 150 s)
#   overhead       benchmarks/monitor_overhead.py --source nvml --clients 1,10,50         (box 150 s)
#   nvdashboard    jupyterlab-nvdashboard's server CPU with 1, 10, 50 websockets, if its wheel
#                  was carried; else skipped with the reason                               (box 90 s)
#   notebooks      benchmarks/gpu_notebooks.sh (called, not changed), its tables          (box: the rest)
# GPU_CHECK_STEPS=inventory,monitor  runs only those (a second call after a broken first one);
# GPU_CHECK_BUDGET=470  seconds for all steps (default; the summary is written after every step).
# PYTHON=python3 (default; a dry run prefers the checkout's .venv/bin/python).
#
# Out (at most 8 files, as the device tool brings back): summary.md (commit it as
# benchmarks/results/<date>-h200.md), notebooks.md (gpu_notebooks.sh's own results file),
# run.log (everything printed), raw.tar.gz (every step's JSON, logs, nvidia-smi -q, executed notebooks).
#
# On the device machine (nvidia-h200, see the device tool's KINDS.md): python3 is 3.12 with torch,
# nvidia-ml-py, requests, psutil, pyyaml, jinja2 already there; it LACKS the Jupyter stack:
# jupyter_server, jupyter_client, jupyter_core, ipykernel, ipython, nbclient, nbformat, nbconvert,
# tornado, pyzmq, traitlets and their needs, and jupyterlab-nvdashboard (server part only: its
# jupyterlab requirement is not needed to serve its websockets). Carry them as wheels:
#   here, once:   benchmarks/gpu_check_wheels.sh        # fills .whl/ (ignored via .git/info/exclude, ~15 MiB)
#   device run:   carry [".whl"], timeout_s 560, command:
#     python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; benchmarks/gpu_check.sh "$OUT"
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY="${GPU_CHECK_DRY:-0}"
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUTDIR="${1:-${OUT:-}}"
[ -n "$OUTDIR" ] || { echo "usage: $0 [--dry-run] OUTDIR   (or set OUT)" >&2; exit 2; }
mkdir -p "$OUTDIR" && OUTDIR="$(cd "$OUTDIR" && pwd)"
export GPU_CHECK_DRY="$DRY"
if [ -z "${PYTHON:-}" ]; then
    if [ "$DRY" = 1 ] && [ -x "$REPO/.venv/bin/python" ]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHON PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO/benchmarks:$REPO/devices:$REPO/extensions/gpu-monitor${PYTHONPATH:+:$PYTHONPATH}"
BUDGET="${GPU_CHECK_BUDGET:-470}"
STEPS="${GPU_CHECK_STEPS:-versions,inventory,kernel_memory,monitor,overhead,nvdashboard,notebooks}"
WORK="$(mktemp -d -t gpu-check-XXXXXX)"
RAW="$WORK/raw"
mkdir -p "$RAW"
exec > >(tee "$OUTDIR/run.log") 2>&1

if [ "$DRY" = 1 ]; then
    # The fake nvidia-smi first on PATH; the simulated fleet instead of NVML.
    mkdir -p "$WORK/fake-bin"
    printf '#!/bin/sh\n# SIMULATED nvidia-smi for gpu_check.sh --dry-run\nexec "%s" -m gpu_check.fake_nvidia_smi "$@"\n' "$PYTHON" \
        > "$WORK/fake-bin/nvidia-smi"
    chmod +x "$WORK/fake-bin/nvidia-smi"
    export PATH="$WORK/fake-bin:$PATH"
    export WORKBENCH_SIMULATED_GPUS="${WORKBENCH_SIMULATED_GPUS:-2xH200-141GB}"
    echo "gpu_check: DRY RUN — simulated, not measurements (fake nvidia-smi: $WORK/fake-bin/nvidia-smi)"
else
    unset WORKBENCH_SIMULATED_GPUS WORKBENCH_GPUS
fi
echo "gpu_check: out $OUTDIR, raw $RAW, python $PYTHON, budget ${BUDGET}s, steps $STEPS"

finish() {  # the summary and the archive, after every step
    "$PYTHON" -m gpu_check.summary "$RAW" "$OUTDIR/summary.md" || echo "gpu_check: summary failed"
    tar -czf "$OUTDIR/raw.tar.gz" -C "$WORK" raw 2>/dev/null || true
}

wanted() { case ",$STEPS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# step NAME BOX CMD...: run CMD in min(BOX, what is left of the budget), log to RAW/NAME.log
step() {
    local name="$1" box="$2"; shift 2
    wanted "$name" || return 0
    local left=$(( BUDGET - SECONDS - 10 ))
    [ "$box" -gt "$left" ] && box="$left"
    if [ "$box" -lt 10 ]; then
        printf '%s\t-\t0\t%s\t%s\n' "$name" "$box" "skipped: budget spent" >> "$RAW/steps.tsv"
        echo "gpu_check: $name skipped, budget spent"; finish; return 0
    fi
    echo; echo "== gpu_check: $name (time box ${box}s, $((BUDGET - SECONDS))s of budget left)"
    local t0=$SECONDS rc note=""
    timeout -k 10 "$box" "$@" 2>&1 | tee "$RAW/$name.log"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && note="timed out after ${box}s"
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$box" "$note" >> "$RAW/steps.tsv"
    finish
    return 0
}

step versions 30 "$PYTHON" -m gpu_check.versions "$RAW"
step inventory 45 "$PYTHON" -m gpu_check.inventory "$RAW"
step kernel_memory 90 "$PYTHON" -m gpu_check.kernel_memory "$RAW"
step monitor 150 "$PYTHON" -m gpu_check.monitor "$RAW"

if [ "$DRY" = 1 ]; then
    OVERHEAD_ARGS="--source simulated --gpus 1 --clients 1 --duration 1 --warmup 0.5 --readers proxy --json"
else
    OVERHEAD_ARGS="--source nvml --clients 1,10,50 --duration 10 --json"
fi
echo "$OVERHEAD_ARGS" > "$RAW/overhead.args"
# shellcheck disable=SC2086
step overhead 150 bash -c "\"\$PYTHON\" \"$REPO/benchmarks/monitor_overhead.py\" $OVERHEAD_ARGS"
if wanted overhead && [ -s "$RAW/overhead.log" ]; then "$PYTHON" -m gpu_check.collect overhead "$RAW"; finish; fi

step nvdashboard 90 "$PYTHON" -m gpu_check.nvdashboard_overhead "$RAW"

if [ "$DRY" = 1 ]; then
    # gpu_notebooks.sh belongs to the notebooks; a dry run calls a fresh copy of it over a tree
    # holding only notebook 00 (and the helpers beside the notebooks), quick mode, on the CPU.
    NBTREE="$WORK/nbtree"
    mkdir -p "$NBTREE/benchmarks" "$NBTREE/notebooks"
    cp "$REPO/benchmarks/gpu_notebooks.sh" "$NBTREE/benchmarks/"
    cp "$REPO/notebooks/00-environment-check.ipynb" "$REPO"/notebooks/*.py "$NBTREE/notebooks/" 2>/dev/null
    NBSCRIPT="$NBTREE/benchmarks/gpu_notebooks.sh"
    export GPU_NOTEBOOKS_ALLOW_CPU=1 WORKBENCH_NOTEBOOK_QUICK=1
else
    NBSCRIPT="$REPO/benchmarks/gpu_notebooks.sh"
fi
mkdir -p "$RAW/notebooks"
step notebooks 600 env RESULTS_DIR="$RAW/notebooks" EXECUTED_DIR="$RAW/notebooks/executed" PYTHON="$PYTHON" bash "$NBSCRIPT"
if wanted notebooks; then "$PYTHON" -m gpu_check.collect notebooks "$RAW" "$OUTDIR"; finish; fi

echo
echo "gpu_check: done in ${SECONDS}s; $OUTDIR/summary.md"
[ "$DRY" = 1 ] && echo "gpu_check: DRY RUN — simulated, not measurements"
exit 0
