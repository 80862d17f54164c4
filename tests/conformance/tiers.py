"""The conformance suite's tiers: one driver per backend, all answering the same questions.

A scenario in ``test_conformance.py`` says what happens (start a server
with one GPU, end it behind the hub's back, restart the hub with a lease row
lost) and asks the tier what came of it (the ledger's leases, the GPUs the
runtime gave the server, whether the runtime still runs it). The fakes'
tier (``fake_tier.py``) drives the reference implementations in-process, in milliseconds; the
hub tiers (``hub_tiers.py``) start a real JupyterHub with the real backend and ask the real
runtime: the server process's environment (local), the container
(docker), the Slurm job (slurm). What a driver does for each question is
the backend's own mechanism, documented on its method.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GPUS = 4  # every tier offers four GPUs
QUOTA = 2  # and allows two at once by default


@dataclass
class Spawned:
    """What a spawn came to: running, or refused/failed with the hub's status and words."""

    ok: bool
    status: int
    message: str = ""
    progress: list[str] = field(default_factory=list)
