"""Facts about the images, checked on a real Docker Engine.

The single-user and hub images are built from the real Dockerfiles with the
base swapped (see conftest.py); these tests check what a spawner and an
operator rely on: GPU device requests, the non-root user, versions, the GPU
monitor, the start hook's notebook copy, the datasets/checkpoints mounts, and
that the hub image starts JupyterHub with configurable-http-proxy inside it.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.docker.conftest import CACHE, REPO, docker, inspect

pytestmark = pytest.mark.docker

SIM_GPUS = ["GPU-sim-00-h100-80gb", "GPU-sim-01-h100-80gb"]


def run_in(image: str, *cmd: str, args: tuple[str, ...] = (), timeout: float = 120) -> str:
    """`docker run --rm [args] image cmd...` -> stdout."""
    return docker("run", "--rm", *args, image, *cmd, timeout=timeout).stdout


def wait_for_json(container: str, url: str, failure: str, timeout: float = 90) -> object:
    """The JSON `url` answers once the server in `container` is up; the container's logs on failure."""
    deadline = time.time() + timeout
    last: Exception | None = None
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.load(r)
        except (OSError, ValueError) as e:  # not up yet (refused, reset, an error page), or half a JSON: retry
            last = e
            time.sleep(1)
    logs = docker("logs", container, check=False)
    pytest.fail(f"{failure}: {last}\n{logs.stdout[-2000:]}{logs.stderr[-3000:]}")


# ------------------------------------------------------------------ GPUs


def test_gpu_device_request_sets_nvidia_visible_devices(base_image):
    """With the stand-in hook on dockerd's PATH, a GPU request by UUID is honoured."""
    gpus = ",".join(SIM_GPUS)
    env = run_in(base_image, "env", args=("--gpus", f'"device={gpus}"'))
    assert f"NVIDIA_VISIBLE_DEVICES={gpus}" in env.splitlines()


def test_gpu_device_request_in_inspect(base_image, docker_container):
    """The device request a spawner makes is recorded on the container as asked."""
    gpus = ",".join(SIM_GPUS)
    name = docker_container("--gpus", f'"device={gpus}"', base_image, "sleep", "30")
    (request,) = inspect(name)["HostConfig"]["DeviceRequests"]
    # the CLI leaves Driver empty; dockerd picks nvidia, the driver of capability "gpu"
    assert request["Driver"] in ("", "nvidia")
    assert request["DeviceIDs"] == SIM_GPUS
    assert request["Capabilities"] == [["gpu"]]
    env = docker("exec", name, "sh", "-c", "tr '\\0' '\\n' < /proc/1/environ").stdout.split()
    assert f"NVIDIA_VISIBLE_DEVICES={gpus}" in env


# ------------------------------------------------------------------ single-user image


def test_singleuser_runs_as_non_root(singleuser_image):
    config = inspect(singleuser_image)["Config"]
    assert config["User"] == "1000:100"
    out = run_in(singleuser_image, "sh", "-c", 'id -u; id -un; echo "$HOME"').split()
    assert out == ["1000", "jovyan", "/home/jovyan"]


def test_singleuser_entrypoint_wraps_jupyterhub_singleuser(singleuser_image):
    config = inspect(singleuser_image)["Config"]
    assert config["Entrypoint"] == ["/usr/local/bin/workbench-start"]
    assert config["Cmd"] == ["jupyterhub-singleuser"]


def test_singleuser_versions(singleuser_image):
    assert run_in(singleuser_image, "jupyterhub-singleuser", "--version").strip() == "6.1.1"
    assert run_in(singleuser_image, "jupyter", "lab", "--version").strip() == "4.6.6"
    out = run_in(
        singleuser_image,
        "python",
        "-c",
        "import ipywidgets, ipykernel, pynvml, sys; print(sys.executable)",
    )
    assert out.strip() == "/opt/workbench/venv/bin/python"


def test_singleuser_has_gpu_monitor_extension(singleuser_image, wheelhouse):
    if not list(Path(wheelhouse).glob("workbench_gpu_monitor-*.whl")):
        pytest.skip("the wheelhouse has no workbench-gpu-monitor wheel (WORKBENCH_ALLOW_NO_MONITOR=1 build)")
    out = run_in(singleuser_image, "sh", "-c", "jupyter labextension list 2>&1")
    line = next((shown for shown in out.splitlines() if "workbench-gpu-monitor" in shown), "")
    assert "enabled" in line, out
    assert "OK" in line, out
    out = run_in(singleuser_image, "sh", "-c", "jupyter server extension list 2>&1")
    assert "workbench_gpu_monitor" in out, out
    assert "enabled" in out, out


def test_singleuser_bundles_the_starter_notebooks(singleuser_image):
    repo_files = sorted(
        str(p.relative_to(REPO / "notebooks"))
        for p in (REPO / "notebooks").rglob("*")
        if p.is_file() and ".ipynb_checkpoints" not in p.parts
    )
    out = run_in(singleuser_image, "sh", "-c", "cd /opt/workbench/notebooks && find . -type f | sed 's|^./||' | sort")
    assert sorted(out.split()) == repo_files


def test_singleuser_has_no_docker_socket_and_no_setuid_root_shell(singleuser_image):
    out = run_in(singleuser_image, "sh", "-c", "ls -l /var/run/docker.sock 2>&1; command -v sudo || echo no-sudo")
    assert "No such file" in out
    assert "no-sudo" in out


def _read_home(image: str, volume: str, *cmd: str, bundle: Path | None = None) -> str:
    args = ["-v", f"{volume}:/home/jovyan"]
    if bundle is not None:
        args += ["-v", f"{bundle}:/opt/workbench/notebooks:ro"]
    return docker("run", "--rm", *args, image, *cmd).stdout


def test_start_hook_copies_bundled_notebooks_once_and_never_overwrites(singleuser_image, docker_volume, tmp_path):
    """First start copies; an edited or deleted notebook is left alone on the next
    start; a notebook added by a newer image shows up."""
    bundle = tmp_path / "bundle"
    (bundle / "intro").mkdir(parents=True)
    (bundle / "01-hello.ipynb").write_text('{"cells": [], "v": "bundled"}')
    (bundle / "intro" / "02-gpu.ipynb").write_text('{"cells": [], "v": "bundled"}')
    (bundle / "03-delete-me.ipynb").write_text("{}")
    for p in [tmp_path, *bundle.rglob("*"), bundle]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    home = docker_volume("wb-test-home")

    # first start: everything is copied, owned by the user
    out = _read_home(
        singleuser_image,
        home,
        "sh",
        "-c",
        "cd ~/notebooks && find . -type f | sort && stat -c %u 01-hello.ipynb",
        bundle=bundle,
    )
    assert out.split() == ["./01-hello.ipynb", "./03-delete-me.ipynb", "./intro/02-gpu.ipynb", "1000"]

    # the user edits one notebook and deletes another
    _read_home(
        singleuser_image,
        home,
        "sh",
        "-c",
        "echo edited-by-user > ~/notebooks/01-hello.ipynb && rm ~/notebooks/03-delete-me.ipynb",
        bundle=bundle,
    )
    # a newer image brings one more notebook, and changes a bundled one
    (bundle / "04-new.ipynb").write_text("{}")
    (bundle / "04-new.ipynb").chmod(0o644)
    (bundle / "01-hello.ipynb").write_text('{"cells": [], "v": "bundled-v2"}')

    out = _read_home(
        singleuser_image,
        home,
        "sh",
        "-c",
        "cat ~/notebooks/01-hello.ipynb; cd ~/notebooks && find . -type f | sort",
        bundle=bundle,
    )
    assert out.split() == [
        "edited-by-user",
        "./01-hello.ipynb",
        "./04-new.ipynb",
        "./intro/02-gpu.ipynb",
    ]


def test_start_hook_with_the_image_notebooks_and_a_fresh_volume(singleuser_image, docker_volume):
    """With the real bundle: a fresh home volume gets the image's notebooks and the links."""
    home = docker_volume("wb-test-home")
    out = _read_home(
        singleuser_image,
        home,
        "sh",
        "-c",
        "diff -r /opt/workbench/notebooks ~/notebooks && echo same; readlink ~/datasets ~/checkpoints; stat -c %u ~",
    )
    assert out.split() == ["same", "/datasets", "/checkpoints", "1000"]


def test_datasets_read_only_and_checkpoints_writable(singleuser_image, docker_volume):
    datasets = docker_volume("wb-test-datasets")
    checkpoints = docker_volume("wb-test-ckpt")
    docker(
        "run",
        "--rm",
        "--user",
        "0",
        "-v",
        f"{datasets}:/datasets",
        "--entrypoint",
        "sh",
        singleuser_image,
        "-c",
        "echo data > /datasets/train.csv",
    )
    out = run_in(
        singleuser_image,
        "sh",
        "-c",
        "cat /datasets/train.csv; "
        "touch /datasets/x 2>/dev/null && echo datasets-writable || echo datasets-read-only; "
        "touch /checkpoints/model.pt && echo checkpoints-writable",
        args=(
            "-v",
            f"{datasets}:/datasets:ro",
            "-v",
            f"{checkpoints}:/checkpoints",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
        ),
    )
    assert out.split() == ["data", "datasets-read-only", "checkpoints-writable"]


def test_singleuser_server_starts_and_answers(singleuser_image, docker_container):
    """jupyterhub-singleuser itself cannot start without a hub; JupyterLab from the same
    environment must come up (server extensions load) under the dropped capabilities."""
    name = docker_container(
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        singleuser_image,
        "jupyter",
        "lab",
        "--ip=0.0.0.0",
        "--port=8888",
        "--ServerApp.token=",
        "--ServerApp.password=",
        "--no-browser",
    )
    ip = inspect(name)["NetworkSettings"]["IPAddress"]
    status = wait_for_json(name, f"http://{ip}:8888/api/status", "JupyterLab did not answer")
    assert "started" in status, status
    assert "kernels" in status, status
    if list((CACHE / "wheelhouse").glob("workbench_gpu_monitor-*.whl")):
        with urllib.request.urlopen(f"http://{ip}:8888/api/gpu/metrics", timeout=10) as r:
            snap = json.load(r)
        assert "gpus" in snap
        assert "source" in snap


# ------------------------------------------------------------------ hub image


def test_hub_image_versions_and_layout(hub_image):
    out = run_in(
        hub_image,
        "sh",
        "-c",
        "jupyterhub --version; configurable-http-proxy --version; "
        "python -c 'import workbench_spawner, workbench_devices, dockerspawner, nativeauthenticator, pynvml; "
        'print("ok")\'; '
        "test -f /srv/workbench/hub/jupyterhub_config.py && echo config; pwd; echo $WORKBENCH_BACKEND",
    )
    lines = out.split()
    assert lines[0] == "6.1.1"
    assert lines[1].startswith("4.")
    assert lines[2:] == ["ok", "config", "/srv/workbench/data", "docker"]
    config = inspect(hub_image)["Config"]
    assert config["Cmd"] == ["jupyterhub", "-f", "/srv/workbench/hub/jupyterhub_config.py"]


def test_hub_image_has_the_inventory_but_no_gpu_monitor(hub_image):
    """The hub gets the GPU inventory from workbench-devices; no JupyterLab extension is built for it."""
    out = run_in(
        hub_image,
        "sh",
        "-c",
        "pip list --format=freeze 2>/dev/null | grep -i '^workbench'; "
        "python -c 'import workbench_gpu_monitor' 2>/dev/null && echo monitor || echo no-monitor; "
        "ls /opt/workbench/venv/share/jupyter/labextensions 2>/dev/null | wc -l",
    )
    assert out.split() == ["workbench-devices==0.1.0", "no-monitor", "0"], out


def test_hub_image_starts_jupyterhub_with_its_proxy(hub_image, docker_container):
    """JupyterHub (plain config) starts configurable-http-proxy in the container and
    answers through it: the proxy and Node.js in the image work."""
    name = docker_container(hub_image, "jupyterhub", "--ip=0.0.0.0", "--port=8000")
    ip = inspect(name)["NetworkSettings"]["IPAddress"]
    info = wait_for_json(name, f"http://{ip}:8000/hub/api", "the hub did not answer through the proxy")
    assert info["version"] == "6.1.1"
    top = docker("top", name, "-efww").stdout  # ww: ps would cut the command at a COLUMNS dockerd inherited
    assert "configurable-http-proxy" in top


# ------------------------------------------------------------------ cache


def test_build_script_reuses_cached_images(singleuser_image, hub_image):
    """A second run with unchanged inputs rebuilds nothing (one run first, in case
    sources changed since the fixtures built the images)."""

    def build_all() -> str:
        proc = subprocess.run(
            ["bash", str(REPO / "images" / "build-test-images.sh"), "all"],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    build_all()
    before = {img: inspect(img)["Id"] for img in (singleuser_image, hub_image)}
    log = build_all()
    assert log.count("up to date") == 5, log
    assert " built in " not in log, log
    assert {img: inspect(img)["Id"] for img in before} == before
