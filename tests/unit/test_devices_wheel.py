"""workbench-devices installs and imports alone: no Jupyter, no tornado, only nvidia-ml-py.

This is what lets the hub image get the GPU inventory without building a
JupyterLab extension.  The wheel is the one ``make install`` built in
``devices/dist`` (built here when absent), installed into a fresh venv.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEVICES = REPO / "devices"

CHECK = """
import json, sys
import workbench_devices
from workbench_devices import make_source
reading = make_source({"WORKBENCH_SIMULATED_GPUS": "2", "WORKBENCH_GPUS": "GPU-sim-01-h100-80gb"}).read()
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("jupyter_server", "jupyterlab", "tornado", "traitlets"))
print(json.dumps({"file": workbench_devices.__file__, "gpus": [g["uuid"] for g in reading["gpus"]], "heavy": heavy}))
"""


def devices_wheel(tmp_path: Path) -> Path:
    built = sorted((DEVICES / "dist").glob("workbench_devices-*.whl"))
    if built:
        return built[-1]
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(DEVICES)],
        check=True,
        timeout=300,
    )
    return next(out.glob("workbench_devices-*.whl"))


def test_the_wheel_alone_imports_without_jupyter(tmp_path):
    wheel = devices_wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py)]
    subprocess.run([*pip, "install", "-q", "--disable-pip-version-check", str(wheel)], check=True, timeout=600)

    installed = json.loads(
        subprocess.run([*pip, "list", "--format=json"], check=True, capture_output=True, text=True).stdout
    )
    assert sorted(p["name"].lower() for p in installed) == ["nvidia-ml-py", "workbench-devices"]

    result = subprocess.run([str(py), "-I", "-c", CHECK], check=True, capture_output=True, text=True, cwd=tmp_path)
    out = json.loads(result.stdout)
    assert out["file"].startswith(str(venv))
    assert out["gpus"] == ["GPU-sim-01-h100-80gb"]
    assert out["heavy"] == []
