"""The hub's idle-GPU settings, as traits (a base of ``GPUPolicyConfig``).

They are resolved once by the hub with the rest of the policy's settings and
stored for the workbench service, which enforces them (``workbench_spawner.rules.idle``
has the rules, ``workbench_hub/service/gpu_reclaim.py`` the loop). A quota
(user or group) may override the minutes and the threshold.
"""

from __future__ import annotations

import os

from traitlets import Float, Unicode, default, validate
from traitlets.config import Configurable
from traitlets.traitlets import TraitError
from traitlets.utils.bunch import Bunch

from workbench_spawner.rules.idle import DEFAULT_THRESHOLD, DEFAULT_WARN_MINUTES, MAX_IDLE_MINUTES, MIN_IDLE_MINUTES


class IdlePolicyConfig(Configurable):
    gpu_idle_minutes = Float(
        0.0,
        min=0,
        help=f"""
        Stop a server whose GPUs all stayed under ``gpu_idle_threshold`` for
        this many minutes, so its GPUs go to the next person waiting. 0 (the
        default) turns idle reclaim off. A user's or group's quota may set its
        own value (``gpu_idle_minutes`` in the quota; 0 there exempts). The
        owner is warned ``gpu_idle_warn_minutes`` before, in JupyterLab; files
        stay; the usage ledger says "reclaimed: GPU idle 30 min". Servers whose
        readings are missing are never reclaimed. Between {MIN_IDLE_MINUTES:g}
        and {MAX_IDLE_MINUTES:g}. Example for a course lab:
        ``c.GPUSpawnerMixin.gpu_idle_minutes = 30``. The shipped config takes
        it from $WORKBENCH_GPU_IDLE_MINUTES.
        """,
    ).tag(config=True)

    @validate("gpu_idle_minutes")
    def _check_idle_minutes(self, proposal: Bunch) -> float:
        value: float = proposal["value"]
        if value and not MIN_IDLE_MINUTES <= value <= MAX_IDLE_MINUTES:
            raise TraitError(
                f"gpu_idle_minutes must be 0 (off) or between {MIN_IDLE_MINUTES:g} and "
                f"{MAX_IDLE_MINUTES:g}, not {value:g}"
            )
        return value

    gpu_idle_threshold = Float(
        DEFAULT_THRESHOLD,
        min=0,
        max=100,
        help="""
        Utilization (percent) under which a GPU counts as idle for
        ``gpu_idle_minutes``. The default 5 % lets a notebook that only holds
        a model in memory count as idle while any real training step keeps it
        busy. $WORKBENCH_GPU_IDLE_THRESHOLD in the shipped config; a quota may
        set ``gpu_idle_threshold``.
        """,
    ).tag(config=True)

    gpu_idle_warn_minutes = Float(
        DEFAULT_WARN_MINUTES,
        min=0,
        help="""
        How long before the stop the owner is warned (a JupyterLab
        notification and a status-bar countdown). At most half of the idle
        limit is used, so a 10-minute limit warns after 5 idle minutes.
        $WORKBENCH_GPU_IDLE_WARN_MINUTES in the shipped config.
        """,
    ).tag(config=True)

    simulated_utilization = Unicode(
        help="""
        For simulated GPUs only: the path of a JSON file that scripts their
        utilization (``{"GPU-sim-00-h100-80gb": 0, "*": 80}``; ``null`` for
        "no reading"), read again whenever it changes. Tests and demos use it
        to make a GPU idle. Passed on to the workbench service and to user
        servers. Defaults to $WORKBENCH_SIMULATED_UTILIZATION.
        """,
    ).tag(config=True)

    @default("simulated_utilization")
    def _default_simulated_utilization(self) -> str:
        return os.environ.get("WORKBENCH_SIMULATED_UTILIZATION", "")
