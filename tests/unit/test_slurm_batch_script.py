"""The Slurm job's batch script, rendered through batchspawner's own ``submit_batch_script``.

The script comes from the ``batch_script`` template and the ``req_*`` traits
(batchspawner's public extension points); these are the scripts the
workbench submitted before it stopped overriding batchspawner's private
``_get_batch_script``, byte for byte, for a whole-GPU, a slice, a whole GPU
on a cluster with slices, and a CPU-only request; but for the command line,
whose words are now shell-quoted (an environment prefix with a space broke it).
"""

from __future__ import annotations

import asyncio
import shlex
from types import SimpleNamespace

import pytest
from jupyterhub.spawner import SpawnException

from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_spawner.backends.slurm.spawner import SlurmGPUSpawner
from workbench_spawner.form.options import SpawnRequest

SPEC = "2xH100-80GB,1xH200-141GB:mig=2x1g.18gb+1x3g.71gb"

HEAD = """#!/bin/bash
#SBATCH --job-name=wb-ann
#SBATCH --comment=workbench:0a1b2c3d:ann/lab
#SBATCH --no-requeue
"""
TAIL = """#SBATCH --partition=gpu
#SBATCH --account=lab
#SBATCH --qos=normal
#SBATCH --constraint=fast
#SBATCH --output=/home/ann/workbench-slurm-%j.log
#SBATCH --chdir=/home/ann
#SBATCH --export=PATH,JUPYTERHUB_API_TOKEN
#SBATCH --get-user-env=L
set -euo pipefail
# --get-user-env=L ran the user's login shell, which reset PATH: the shared environment goes first again.
export PATH='/opt/work bench/bin':$PATH
trap 'echo SIGTERM received' TERM

'/opt/work bench/bin/workbench-slurm-singleuser' jupyterhub-singleuser
"""
LIMITS = """#SBATCH --cpus-per-task=4
#SBATCH --mem=8192M
"""
TIME = "#SBATCH --time=0-02:30:00\n"


def spawner(request: SpawnRequest, hours: float | None) -> SlurmGPUSpawner:
    user = SimpleNamespace(name="ann", url="/user/ann/", escaped_name="ann")
    hub = SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/")
    s = SlurmGPUSpawner(
        user=user,
        hub=hub,
        orm_spawner=SimpleNamespace(name="lab", server=None),
        req_homedir="/home/ann",
        req_keepvars="PATH,JUPYTERHUB_API_TOKEN",
        slurm_env_prefix="/opt/work bench",
        slurm_partition="gpu",
        slurm_account="lab",
        slurm_qos="normal",
        slurm_extra_options="--constraint=fast",
        cpu_limit=4,
        mem_limit=8 * 1024**3,
        simulated_gpus=SPEC,
    )
    s.gpu_request = request
    s.user_options = {"gpus": request.gpus}
    s.gpu_session_hours = lambda: hours
    s.hub_id = lambda: "0a1b2c3d"
    s.engine_inventory = lambda: DeviceInventory("simulated", parse_simulated_spec(SPEC, "wbnode2"), "")
    s.user_env = lambda env: env  # batchspawner reads the submitting account's home: "ann" need not exist here
    return s


def submitted(s: SlurmGPUSpawner) -> str:
    """The script batchspawner hands ``sbatch`` on its stdin."""
    seen = {}

    async def run_command(cmd, input=None, env=None):
        seen["script"] = input
        return "4242"

    s.run_command = run_command
    assert asyncio.run(s.submit_batch_script()) == "4242"
    return seen["script"]


@pytest.mark.parametrize(
    ("request_", "hours", "script"),
    [
        (
            SpawnRequest(gpus=2, gpu_model="H100-80GB"),
            2.5,
            HEAD + "#SBATCH --gres=gpu:h100-80gb:2\n" + LIMITS + TIME + TAIL,
        ),
        (
            SpawnRequest(gpus=1, gpu_profile="1g.18gb"),
            2.5,
            HEAD + "#SBATCH --gres=gpu:1g.18gb:1\n" + LIMITS + TIME + TAIL,
        ),
        # No model on a cluster with slices: the GRES names the whole GPUs' type, or Slurm could hand out a slice.
        (SpawnRequest(gpus=1), 2.5, HEAD + "#SBATCH --gres=gpu:h100-80gb:1\n" + LIMITS + TIME + TAIL),
        (SpawnRequest(gpus=0), None, HEAD + LIMITS + TAIL),
    ],
    ids=["gpu", "slice", "whole-on-sliced-cluster", "cpu-only"],
)
def test_the_batch_script_is_what_the_workbench_always_submitted(request_, hours, script):
    assert submitted(spawner(request_, hours)) == script


def test_an_option_cannot_replace_the_sbatch_lines_the_hub_computes():
    # batchspawner lays user_options over the template's variables: "sbatch_lines" would undo admission.
    s = spawner(SpawnRequest(gpus=1), 2.5)
    s._check_account = lambda: None
    with pytest.raises(SpawnException) as caught:
        asyncio.run(s.check_options({"gpus": 1, "sbatch_lines": ["--gres=gpu:8"]}))
    assert caught.value.status_code == 400
    assert "'sbatch_lines' is set by the hub" in str(caught.value)
    assert asyncio.run(s.check_options({"gpus": 1})) == {"gpus": 1}


def test_the_command_line_keeps_each_word_whole_whatever_it_holds():
    # batchspawner joins the words as they are: "/opt/work bench/..." ran "/opt/work" before.
    s = spawner(SpawnRequest(gpus=0), None)
    s.args = ["--ServerApp.tornado_settings={'x': 1}", "--notebook-dir=/home/ann/my work"]
    words = shlex.split(submitted(s).splitlines()[-1])  # the last line: the command
    assert words == [
        "/opt/work bench/bin/workbench-slurm-singleuser",
        "jupyterhub-singleuser",
        "--ServerApp.tornado_settings={'x': 1}",
        "--notebook-dir=/home/ann/my work",
    ]
