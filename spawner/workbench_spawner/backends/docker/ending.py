"""Why a user's container ended, and the removal of a container that died: a base of ``DockerGPUSpawner``.

Docker keeps an ended container's facts until it is removed: ``State.OOMKilled``
(the memory limit's kill, with ``HostConfig.Memory``), ``State.ExitCode`` and
the log. The GPU policy asks for them when a poll finds the server dead
(``gpu_exit_reason``) and when the reconciler finds a lease's container ended
(``gpu_lease_gone_reason``); :func:`container_ending` turns them into the
ledger's reason and the student's sentence. A container that died on its own
is removed once its end is read (``poll``), because JupyterHub calls ``stop``
only for servers its poll finds running. Kept apart from the spawner's
lock-down and create call (``spawner.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import docker

from workbench_spawner.backends.docker.base import ENGINE_ERRORS, DockerGPUBase
from workbench_spawner.ledger import endings
from workbench_spawner.ledger.endings import LOG_LINES, Ending
from workbench_spawner.ledger.store import Lease

# Lines of a container's log read to tell a student why it exited (a few more than shown: blank ones go).
LOG_TAIL = 2 * LOG_LINES


class ContainerEnding(DockerGPUBase):
    """``gpu_exit_reason``, ``gpu_lease_gone_reason`` and the dead container's removal in ``poll``.

    Goes before ``GPUSpawnerMixin`` in ``DockerGPUSpawner``'s bases, on the
    spawner's DockerSpawner state (``get_object``, ``docker``,
    ``container_id``, ``remove_object``) and its blocking client (``_sync_client``).
    """

    async def gpu_exit_reason(self) -> Ending | None:
        """Docker says why the container ended: ``State.OOMKilled`` is its memory limit's kill (the
        profile's ``mem_limit``, ``HostConfig.Memory``), which the student hears as "out of memory" with
        the limit; any other end is the server exiting, with its exit code and the last lines of its log.
        The state is read first: a log the engine cannot give (a container being removed) loses nothing."""
        try:
            container = await self.get_object()
        except ENGINE_ERRORS as exc:  # the daemon away or the container being removed: poll goes on
            self.log.warning("Cannot inspect %s's container to say why it ended: %s", self.user.name, exc)
            return None
        log = b""
        if container:
            try:
                log = await self.docker("logs", self.container_id, tail=LOG_TAIL)
            except ENGINE_ERRORS as exc:
                self.log.info("No log of %s's ended container: %s", self.user.name, exc)
        return container_ending(container or {}, log)

    async def poll(self):
        status = await super().poll()  # the GPU mixin has read why a dead container ended, and recorded it
        if status not in (None, 0) and self.remove and self.object_id and self._gpu_stopping is None:
            # A container that died (not one being stopped: stop removes it) is removed now that its end is
            # read: JupyterHub calls stop() only for servers its poll finds running, so nothing else would.
            try:
                await self.remove_object()
            except ENGINE_ERRORS as exc:  # the engine is away: the next start's name clash removes it
                self.log.warning("Cannot remove %s's ended container: %s", self.user.name, exc)
        return status

    def gpu_lease_gone_reason(self, lease: Lease) -> Ending | None:
        """The same rule for the reconciler (blocking): the container's state if it is still there (exited),
        "server exited" if it is gone; None when the engine cannot be asked or the lease named no container."""
        if not lease.ref.startswith("container:"):
            return None
        try:
            container = self._sync_client().containers.get(lease.ref.split(":", 1)[1])
            log = container.logs(tail=LOG_TAIL)
        except docker.errors.NotFound:
            return endings.server_exited()
        except ENGINE_ERRORS:  # the engine is away: say nothing rather than guess
            return None
        return container_ending(container.attrs, log)


def container_ending(inspected: Mapping[str, Any], log: bytes | str = b"") -> Ending:
    """Why a container that is no longer running ended, from ``docker inspect``'s answer and its log's tail.

    ``State.OOMKilled`` with the memory limit (``HostConfig.Memory``) is "out of memory"; otherwise the
    server exited with ``State.ExitCode`` (137 without OOMKilled: killed by a signal, e.g. ``docker kill``)."""
    state = inspected.get("State") or {}
    if state.get("OOMKilled"):
        limit = int((inspected.get("HostConfig") or {}).get("Memory") or 0)
        return endings.out_of_memory(limit or None)
    text = log.decode("utf-8", "replace") if isinstance(log, bytes) else str(log or "")
    code = state.get("ExitCode")
    return endings.server_exited(int(code) if isinstance(code, int) else None, text)
