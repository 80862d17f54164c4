"""JupyterHub's spawn limit for a class start, above the GPU line (``policy/spawn_limits.py`` derives both).

The end of the hub's config (``finish.py``, on a host and in the z2jh chart's hub pod) calls it on the final
config, after the policy's settings are resolved: the limits depend on the inventory.
"""

from __future__ import annotations

from traitlets.config import Config

from workbench_spawner.policy.spawn_limits import SpawnLimits


def update_spawn_limits(c: Config, final: Config, limits: SpawnLimits) -> str:
    """JupyterHub's ``concurrent_spawn_limit`` above the GPU line (``spawn_limits.py``), so that a class
    waits in line instead of getting 429s; a local config's own value is kept. Returns a warning when that
    value would refuse students before the line is full, else ""."""
    if "concurrent_spawn_limit" not in final.JupyterHub:
        c.JupyterHub.concurrent_spawn_limit = limits.concurrent_spawn_limit
        return ""
    chosen = int(final.JupyterHub.concurrent_spawn_limit)
    if chosen and chosen < limits.max_waiting + limits.max_starting:
        return (
            f"c.JupyterHub.concurrent_spawn_limit = {chosen} is set in the config: past {chosen} pending spawns "
            f"JupyterHub answers 429 before a student gets a place in line (up to {limits.max_waiting} may wait, "
            f"WORKBENCH_MAX_WAITING); remove it to let the hub derive {limits.concurrent_spawn_limit}"
        )
    return ""
