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
import threading
import time
from collections.abc import Callable, Sequence

from workbench_spawner.backends.slurm.jobs import SlurmUnavailableError, list_nodes
from workbench_spawner.backends.slurm.records import SlurmNode

log = logging.getLogger("workbench.slurm")


class NodeStates:
    """Slurm's node records, cached; ``unusable()`` names the nodes that take no job now (blocking)."""

    def __init__(
        self,
        nodes: Callable[[], Sequence[SlurmNode]] = list_nodes,
        max_age: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        retry_after: float = 30.0,
    ):
        self.read = nodes
        self.max_age = max_age
        self.retry_after = retry_after
        self.clock = clock
        self._nodes: dict[str, SlurmNode] | None = None
        self._next_read: float | None = None
        self._lock = threading.Lock()

    def nodes(self) -> dict[str, SlurmNode] | None:
        """Every node by name as Slurm last told (None: Slurm has not answered yet). Blocking."""
        with self._lock:
            if self._next_read is None or self.clock() >= self._next_read:
                try:
                    self._nodes = {n.name: n for n in self.read()}
                    wait = self.max_age
                except SlurmUnavailableError as exc:
                    log.warning("Slurm's node records could not be read (kept what it said before): %s", exc)
                    wait = self.retry_after
                self._next_read = self.clock() + wait  # from the answer: a slow sinfo does not run back to back
            return self._nodes

    def unusable(self) -> dict[str, str]:
        """Node name -> why Slurm starts no new job there ("down, not responding (Not responding)")."""
        return {
            name: why for name, node in (self.nodes() or {}).items() if (why := node.unusable_because()) is not None
        }
