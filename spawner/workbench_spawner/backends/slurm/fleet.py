"""The fleet view's Slurm side: which GPUs Slurm itself counts as allocated, per node.

On a Slurm hub the ledger knows the GPUs our jobs hold; Slurm's node records
(``sinfo --json``: GRES and GRES used with indices) know every job's. A GPU
Slurm allocates with no lease in our ledger is held by a job outside the
workbench (a batch job, another hub), and the admin page says so. Read from
the service's own process (the hub host has Slurm's clients), cached for a
couple of seconds so a busy page does not hammer slurmctld.
"""

from __future__ import annotations

import logging
import threading
import time

from workbench_spawner.backends.slurm.jobs import SlurmNode, SlurmUnavailable, list_nodes

log = logging.getLogger("workbench.service")

_cache: dict[str, SlurmNode] | None = None
_cached_at = 0.0
_lock = threading.Lock()


def slurm_nodes(max_age: float = 2.0) -> dict[str, SlurmNode] | None:
    """Slurm's node records by name (None: the controller did not answer)."""
    global _cache, _cached_at
    with _lock:
        if _cache is not None and time.monotonic() - _cached_at < max_age:
            return _cache
        try:
            _cache = {n.name: n for n in list_nodes()}
        except SlurmUnavailable as exc:
            log.warning("Slurm's node records could not be read for the fleet view: %s", exc)
            _cache = None
        _cached_at = time.monotonic()
        return _cache


def annotate_slurm(gpus: list[dict]) -> None:
    """Add ``slurm`` (node state, allocated by Slurm, held outside the workbench) to each GPU row."""
    nodes = slurm_nodes()
    for gpu in gpus:
        node = (nodes or {}).get(gpu["node"])
        allocated = bool(node and gpu["index"] in node.gpus_used)
        gpu["slurm"] = {
            "node_state": node.state.lower() if node else "unknown",
            "allocated": allocated,
            "held_outside_workbench": allocated and not gpu["holders"],
        }
