"""Which Slurm nodes take no new job now, and why: Slurm's node records, read at most every few seconds.

The spawn form, admission, the wait sentence and the fleet view all count a
GPU on a node that is DOWN, drained, failing, not responding, powered down or
in a maintenance reservation as neither free nor in use (``SlurmNode.
unusable_because`` has the rule). They ask often: every render of the form,
every poll of a pending job, every refresh of the admin page. ``NodeStates``
runs ``sinfo --json`` at most once per ``max_age`` seconds for all of them,
one caller at a time (the others wait for its answer instead of running
sinfo too). When Slurm's controller does not answer, the last answer is
kept (a node Slurm cannot tell about is not declared dead by the hub), and
before any answer every node counts as usable; it is asked again only after
``retry_after`` seconds, so a controller that times out does not hold up
every render of the form.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from workbench_spawner.backends.slurm.jobs import SlurmUnavailableError, list_nodes
from workbench_spawner.backends.slurm.records import SlurmNode
from workbench_spawner.placement.engine_fleet import Recent

log = logging.getLogger("workbench.slurm")


class NodeStates(Recent[dict[str, SlurmNode]]):
    """Slurm's node records by name, cached (``nodes()``: None until Slurm first answered); ``unusable()``
    names the nodes that take no job now (blocking)."""

    def __init__(
        self,
        nodes: Callable[[], Sequence[SlurmNode]] = list_nodes,
        max_age: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        retry_after: float = 30.0,
    ):
        super().__init__(
            lambda: {n.name: n for n in nodes()},
            max_age,
            unavailable=SlurmUnavailableError,
            warning="Slurm's node records could not be read (kept what it said before): %s",
            keep=True,
            retry_after=retry_after,
            clock=clock,
            logger=log,
        )

    def nodes(self) -> dict[str, SlurmNode] | None:
        """Every node by name as Slurm last told (None: Slurm has not answered yet). Blocking."""
        return self()

    def unusable(self) -> dict[str, str]:
        """Node name -> why Slurm starts no new job there ("down, not responding (Not responding)")."""
        return {
            name: why for name, node in (self.nodes() or {}).items() if (why := node.unusable_because()) is not None
        }
