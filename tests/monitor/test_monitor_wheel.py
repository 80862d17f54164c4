"""The built wheel alone, in a fresh virtualenv without node, is a working JupyterLab extension.

Build the wheels first (``make install`` does; the monitor's needs node, jlpm
comes from the jupyterlab package)::

    python -m build --wheel --no-isolation --outdir devices/dist devices
    cd extensions/gpu-monitor && jlpm install && jlpm clean:all && python -m build --wheel --no-isolation .

Skipped with the reason when either ``dist/*.whl`` is absent, failed instead
when ``WORKBENCH_STRICT_TESTS=1``.  Installs the two wheels, and from PyPI (or
the configured index) their dependencies plus jupyterlab, nothing else.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from tests.conftest import missing as skip_or_fail  # skip, or fail in CI
from tests.monitor.monitor_support import DEVICES_DIR, EXTENSION_DIR

JUPYTERLAB = os.environ.get("WORKBENCH_TEST_JUPYTERLAB", "jupyterlab==4.6.6")


def run(cmd, env, timeout=600):
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def test_wheel_installs_without_node_and_reports_enabled_ok(tmp_path):
    wheels = sorted((EXTENSION_DIR / "dist").glob("workbench_gpu_monitor-*.whl"))
    if not wheels:
        skip_or_fail(f"no wheel in {EXTENSION_DIR / 'dist'}: build it with python -m build --wheel")
    wheel = wheels[-1]
    # workbench-devices is no index's: the monitor's one requirement of our own comes from devices/dist.
    devices_wheels = sorted((DEVICES_DIR / "dist").glob("workbench_devices-*.whl"))
    if not devices_wheels:
        skip_or_fail(f"no wheel in {DEVICES_DIR / 'dist'}: build it with python -m build --wheel devices")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "JUPYTER", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), str(empty)])
    env["HOME"] = str(tmp_path / "home")
    env["JUPYTER_CONFIG_DIR"] = str(tmp_path / "config")  # only the wheel's sys.prefix config counts
    assert shutil.which("node", path=env["PATH"]) is None
    assert shutil.which("npm", path=env["PATH"]) is None

    py = str(venv / "bin" / "python")
    run(
        [
            py,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            str(devices_wheels[-1]),
            str(wheel),
            JUPYTERLAB,
        ],
        env,
    )

    servers = run([py, "-m", "jupyter", "server", "extension", "list"], env)
    assert re.search(r"workbench_gpu_monitor\s+(\x1b\[\d+m)?enabled", servers), servers
    assert re.search(r"workbench_gpu_monitor 0\.1\.0\s+(\x1b\[\d+m)?OK", servers), servers

    labs = run([py, "-m", "jupyter", "labextension", "list"], env)
    assert re.search(r"workbench-gpu-monitor v0\.1\.0\s+(\x1b\[\d+m)?enabled(\x1b\[0m)?\s+(\x1b\[\d+m)?OK", labs), labs
    assert "prebuilt" in labs.lower() or "Other labextensions" in labs or "workbench-gpu-monitor" in labs

    # the installed package is the one from the wheel, and its sampler runs
    out = run(
        [
            py,
            "-c",
            "import workbench_gpu_monitor, os; from workbench_devices import make_source; "
            "print(workbench_gpu_monitor.__file__); "
            "print(make_source({'WORKBENCH_SIMULATED_GPUS': '2', 'WORKBENCH_GPUS': 'GPU-sim-01-h100-80gb'})"
            ".read()['gpus'][0]['uuid'])",
        ],
        env,
    )
    assert str(venv) in out
    assert "GPU-sim-01-h100-80gb" in out
    requires = next(
        line
        for line in run([py, "-m", "pip", "show", "workbench-gpu-monitor"], env).splitlines()
        if line.startswith("Requires:")
    )
    assert "workbench-devices" in requires, requires
