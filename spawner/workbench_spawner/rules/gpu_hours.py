"""TEMPORARY (issue 38): GPU-hours are read from the database, so they moved to ``workbench_spawner.ledger.gpu_hours``.

``rules/`` holds pure rules (no I/O). This name is kept only for the two
modules that still import it (``placement/host.py`` and
``backends/slurm/spawner.py``, being edited elsewhere at the time of the
move); remove it once they import from the ledger.
"""

from workbench_spawner.ledger.gpu_hours import HELD_NOW, WEEK, gpu_hours_by_reason, gpu_hours_by_user, gpu_hours_used

__all__ = ["HELD_NOW", "WEEK", "gpu_hours_by_reason", "gpu_hours_by_user", "gpu_hours_used"]
