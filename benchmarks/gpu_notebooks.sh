#!/usr/bin/env bash
# Run every starter notebook (notebooks/*.ipynb) on a CUDA machine, collect the markdown
# results tables they print, and write them to benchmarks/results/<date>-<gpu>.md.
#
# Usage (from anywhere):   benchmarks/gpu_notebooks.sh
#   PYTHON=/path/to/python   interpreter with torch (CUDA build), nbclient, nbformat, ipykernel
#                            (default: python3)
#   RESULTS_DIR=dir          where the .md goes (default: benchmarks/results)
#   EXECUTED_DIR=dir         where executed copies of the notebooks go (default: a temp dir)
#   CUDA_VISIBLE_DEVICES     as usual: which GPUs the notebooks may use (04 uses all of them)
#   GPU_NOTEBOOKS_ALLOW_CPU=1  skip the CUDA check (only to test this script on a CPU machine)
#
# Exits 2 with a message when PyTorch cannot see a CUDA GPU, 1 when a notebook fails.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
RESULTS_DIR="${RESULTS_DIR:-$REPO/benchmarks/results}"

if [ "${GPU_NOTEBOOKS_ALLOW_CPU:-0}" = 1 ]; then
    echo "gpu_notebooks.sh: GPU_NOTEBOOKS_ALLOW_CPU=1, running on whatever device there is (testing this script only)" >&2
elif ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_notebooks.sh: no CUDA GPU visible to PyTorch ($PYTHON)." >&2
    echo "  This script measures the notebooks on a GPU; run it on a CUDA machine with a CUDA build" >&2
    echo "  of torch. On a CPU, use 'pytest tests/notebooks' instead." >&2
    exit 2
fi
for mod in nbclient nbformat ipykernel; do
    "$PYTHON" -c "import $mod" 2>/dev/null || { echo "gpu_notebooks.sh: $PYTHON lacks $mod (pip install $mod)" >&2; exit 2; }
done

mkdir -p "$RESULTS_DIR"
EXECUTED_DIR="${EXECUTED_DIR:-$(mktemp -d -t gpu-notebooks-XXXXXX)}"
mkdir -p "$EXECUTED_DIR"

exec "$PYTHON" - "$REPO" "$RESULTS_DIR" "$EXECUTED_DIR" <<'PY'
import datetime, json, os, re, shutil, subprocess, sys, tempfile, time
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

repo, results_dir, executed_dir = map(Path, sys.argv[1:4])

# A kernelspec for this very interpreter, so the notebooks run with the same torch.
kroot = Path(tempfile.mkdtemp(prefix="gpu-nb-kernel-"))
(kroot / "kernels" / "gpu-nb").mkdir(parents=True)
(kroot / "kernels" / "gpu-nb" / "kernel.json").write_text(json.dumps({
    "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
    "display_name": "gpu notebooks", "language": "python"}))
os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(kroot), os.environ.get("JUPYTER_PATH")]))

def smi(query):
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None

gpu = smi("name") or (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
driver = smi("driver_version") or "unknown"
slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
out_path = results_dir / f"{date}-{slug}.md"

def tables_of(nb):
    """The '#### title' + markdown table blocks printed by the notebook, in order."""
    text = "\n".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", [])
                     if o.get("output_type") == "stream" and o.get("name") == "stdout")
    blocks, cur = [], []
    for line in text.splitlines():
        if line.startswith("#### "):
            cur = [line]
        elif line.startswith("|") and cur:
            cur.append(line)
        elif not line.strip() and len(cur) == 1:
            continue
        elif cur and len(cur) > 1:
            blocks.append(cur); cur = []
    if cur and len(cur) > 1:
        blocks.append(cur)
    return blocks

def rows(block):
    header = [c.strip() for c in block[1].strip("|").split("|")]
    return [dict(zip(header, [c.strip() for c in l.strip("|").split("|")])) for l in block[3:]]

def render(block):
    return "\n".join([block[0], ""] + block[1:])

sections, failures, found = [], [], {}
for path in sorted((repo / "notebooks").glob("*.ipynb")):
    work = executed_dir / path.stem
    work.mkdir(parents=True, exist_ok=True)
    for helper in (repo / "notebooks").glob("*.py"):   # workbench_timing.py: next to the notebook, as in a home
        shutil.copy2(helper, work / helper.name)
    nb = nbformat.read(str(path), as_version=4)
    client = NotebookClient(nb, kernel_name="gpu-nb", timeout=900, resources={"metadata": {"path": str(work)}})
    print(f"running {path.name} ...", flush=True)
    t0 = time.perf_counter()
    error = None
    try:
        client.execute()
    except CellExecutionError as err:
        error = str(err).splitlines()[-1] if str(err) else "cell error"
    seconds = time.perf_counter() - t0
    nbformat.write(nb, str(work / path.name))
    blocks = tables_of(nb)
    for b in blocks:
        found[b[0][5:].strip()] = rows(b)
    status = f"FAILED: {error}" if error else ("ok" if seconds < 120 else "ok, but over the 2-minute GPU budget")
    print(f"  {seconds:.0f} s, {status}", flush=True)
    if error:
        failures.append(path.name)
    sections.append(f"## {path.stem} ({seconds:.0f} s, {status})\n\n" +
                    "\n\n".join(render(b) for b in blocks))

def table_rows(prefix):
    for title, r in found.items():
        if title.startswith(prefix):
            return r
    return []

def pick(prefix):
    return {next(iter(x.values())): x for x in table_rows(prefix)}

def timing(r):
    """median, spread and repeats of a row, as the notebooks print them (workbench_timing.py)."""
    return f"spread {r.get('spread')}, {r.get('repeats x steps')} repeats x steps, {r.get('fp32 precision')}"

summary = []
for r in table_rows("Matmul throughput"):      # one row per GPU and precision
    if r.get("achieved TFLOP/s", "").startswith("skipped"):
        summary.append([f"matmul {r.get('precision')} on {r.get('device')}", r.get("achieved TFLOP/s")])
        continue
    summary.append([f"matmul {r.get('precision')} on {r.get('device')}",
                    f"{r.get('achieved TFLOP/s')} TFLOP/s of {r.get('peak TFLOP/s')} peak ({r.get('% of peak')}), {timing(r)}"])
for label, r in pick("torch.compile results").items():
    if label != "eager":
        summary.append([label, r.get("note") if r.get("note", "").startswith("skipped") else
                        f"{r.get('speedup vs eager')} vs eager, warm-up {r.get('warm-up (s)')} s, "
                        f"peak {r.get('peak memory, warm-up (MiB)')} MiB, CUDA graphs: {r.get('CUDA graphs')}, {timing(r)}"])
for label, r in pick("Mixed precision results").items():
    if label != "fp32":
        summary.append([label, r.get("note") if r.get("note", "").startswith("skipped") else
                        f"{r.get('speedup vs fp32')} vs fp32, {r.get('speedup vs TF32')} vs TF32, "
                        f"memory saving {r.get('memory saving')}, {timing(r)}"])
for label, r in pick("Input pipeline results").items():
    summary.append([f"input pipeline: {label}", f"{r.get('samples/s')} samples/s, busy {r.get('busy (est.)')}, "
                    f"first epoch {r.get('warm-up: first epoch incl. worker start-up (s)')} s, {timing(r)}"])
for label, r in pick("Host-to-device copies").items():
    summary.append([f"copy: {label}", r.get("note") if r.get("note", "").startswith("skipped") else
                    f"{r.get('median (ms)')} ms/step, {r.get('GB/s copied')} GB/s, {timing(r)}"])
for label, r in pick("Multi-GPU results").items():
    summary.append([label, f"{r.get('speedup vs 1 process')} ({r.get('scaling efficiency')} efficiency), "
                    f"state {r.get('param+grad+AdamW state per rank (MiB)')} MiB/rank, "
                    f"peak +{r.get('peak memory above baseline per rank (MiB)')} MiB, {timing(r)} {r.get('note')}".strip()])

head = [
    f"# Starter notebooks on {gpu}",
    "",
    f"- date (UTC): {date}",
    f"- GPUs visible: {torch.cuda.device_count()} x {gpu}, driver {driver}",
    f"- PyTorch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}",
    f"- produced by `benchmarks/gpu_notebooks.sh`; executed notebooks were in `{executed_dir}`",
    "",
    "## Summary",
    "",
    "| measurement | result |",
    "|---|---|",
] + [f"| {a} | {b} |" for a, b in summary] + [""]
out_path.write_text("\n".join(head) + "\n" + "\n\n".join(sections) + "\n")
shutil.rmtree(kroot, ignore_errors=True)
print(f"wrote {out_path}")
if failures:
    print("FAILED notebooks: " + ", ".join(failures), file=sys.stderr)
    sys.exit(1)
PY
