"""The Slurm job's batch script: batchspawner's ``batch_script`` template and its ``req_*`` traits.

batchspawner formats ``batch_script`` (Jinja) with every trait whose name
starts with ``req_``, under the name without the prefix
(``get_req_subvars``), then lays the start's ``user_options`` over them
(``submit_batch_script``). These are its public extension points, as the
``batch_script`` trait's own help describes them ("Traits on this class
named like req_xyz will be substituted in the template"), in place of the
private ``_get_batch_script`` the workbench overrode before. It adds two
variables as ``req_*`` traits: ``sbatch_lines`` (the job's ``#SBATCH``
options, computed for each start from the admitted request) and
``env_bin`` (the shared environment, first on PATH again after
``--get-user-env=L`` reset it). Because the options come last, an option
named like either is refused (``refuse_computed_options``): it would
replace what admission decided.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from collections.abc import Mapping

from jupyterhub.spawner import SpawnException
from traitlets import List, Unicode, default

from workbench_spawner.backends.slurm.job_spawner import SlurmJobSpawner
from workbench_spawner.backends.slurm.sbatch import sbatch_options, whole_gpu_type
from workbench_spawner.backends.slurm.traits import SlurmTraits

BATCH_SCRIPT = """#!/bin/bash
{% for opt in sbatch_lines %}#SBATCH {{opt}}
{% endfor %}#SBATCH --output={{homedir}}/workbench-slurm-%j.log
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
#SBATCH --get-user-env=L
set -euo pipefail
# --get-user-env=L ran the user's login shell, which reset PATH: the shared environment goes first again.
export PATH={{env_bin}}:$PATH
trap 'echo SIGTERM received' TERM
{{prologue}}
{{cmd}}
{{epilogue}}
"""

# The batch script's variables the hub computes (``req_sbatch_lines``, ``req_env_bin``), never a start option's.
COMPUTED_SCRIPT_VARIABLES = frozenset({"sbatch_lines", "env_bin"})


def refuse_computed_options(options: Mapping[str, object]) -> None:
    """A SpawnException (400) for start options named like a variable the hub computes for the script.

    batchspawner lays ``user_options`` over the template's variables, so an
    option ``sbatch_lines`` would replace the GRES, the time limit and the
    tag that admission decided."""
    taken = sorted(name for name in options if name in COMPUTED_SCRIPT_VARIABLES)
    if taken:
        raise SpawnException(
            f"Cannot start the server: {', '.join(map(repr, taken))} {'is' if len(taken) == 1 else 'are'} set by "
            "the hub for every Slurm job and cannot be a start option; leave it out.",
            reason="bad_options",
            status_code=400,
        )


class SlurmBatchScript(SlurmTraits, SlurmJobSpawner):
    """batchspawner's SlurmSpawner (as the workbench follows a job) with the script's computed variables;
    ``SlurmGPUSpawner`` puts the GPU mixin before it, which gives the request, the session limit and the
    hub's id.

    The spawner's own body sets the inherited defaults (``batch_script`` to
    ``BATCH_SCRIPT``, the single-user command, no ``srun``), where the
    configuration reference finds them."""

    req_sbatch_lines = List(
        Unicode(),
        help="""
        Set for each start (never configure it): the job's sbatch options,
        one ``#SBATCH`` line each in ``batch_script`` (``sbatch_lines``).
        Computed from the admitted request, the session limit and the
        ``slurm_*`` settings (``sbatch_options``).
        """,
    )

    req_env_bin = Unicode(
        help="""
        Never configure it: the shell-quoted ``bin`` folder of
        ``slurm_env_prefix``, which ``batch_script`` puts first on PATH
        again after ``--get-user-env=L`` (``env_bin``).
        """,
    )

    @default("req_env_bin")
    def _default_req_env_bin(self):
        return shlex.quote(os.path.join(self.slurm_env_prefix, "bin"))

    def cmd_formatted_for_batch(self) -> str:
        """The script's ``cmd`` line, each word shell-quoted.

        batchspawner joins the words with spaces as they are, so a ``slurm_env_prefix`` with a space
        (``/opt/work bench``) split the single-user command in two and no job could start. Words of plain
        characters are left as they were (``shlex.quote``)."""
        return shlex.join([self.batchspawner_singleuser_cmd, *self.cmd, *self.get_args()])

    async def submit_batch_script(self) -> str:
        """batchspawner's submit, with this start's ``#SBATCH`` lines computed first.

        batchspawner formats ``batch_script`` with every ``req_*`` trait under
        its name without the prefix (``get_req_subvars``): the template's
        ``sbatch_lines`` is ``req_sbatch_lines``, set here because it depends
        on the start (admission's session limit, the request, the hub's id)."""
        hours, hub, whole = await asyncio.to_thread(
            lambda: (self.gpu_session_hours(), self.hub_id(), whole_gpu_type(self.engine_inventory()))
        )
        request = self.gpu_request
        self.req_sbatch_lines = sbatch_options(
            user=self.user.name,
            server=self.name,
            gpus=request.gpus,
            model=request.gpu_model,
            profile=request.gpu_profile,
            whole_type=whole,  # the GRES type of a whole-GPU request on a cluster with slices
            cpus=self.cpu_limit or 1,
            mem_bytes=self.mem_limit,
            session_hours=hours,
            partition=self.slurm_partition_choice or self.slurm_partition,
            account=self.slurm_account,
            qos=self.slurm_qos,
            extra=self.slurm_extra_options,
            hub=hub,
        )
        return await super().submit_batch_script()
