"""The server's memory limit and its OOM kills, from the memory cgroup, so a dead kernel can be explained.

A cell that loads too much is killed by the kernel's OOM killer inside the server's memory
cgroup (the container's limit on Docker and Kubernetes, the job's on Slurm). JupyterLab then
only says "The kernel appears to have died". The cgroup counts those kills; this module reads
the count every second and records when it last rose, and the lab says "Your kernel was
stopped because this server reached its memory limit (16 GiB)" when a kernel dies within a
minute of that.

``GET {base_url}api/gpu/memory`` -> ``{"cgroup": "v1"|"v2"|null, "limit_bytes": int|null,
"usage_bytes": int|null, "oom_kills": int|null, "last_oom_kill_at": iso|null, "source": dir|null}``

* cgroup v2: ``memory.events`` (its ``oom_kill`` line), ``memory.max``, ``memory.current``;
  the limit is the lowest ``memory.max`` of the cgroup and its parents (Slurm puts it on the job,
  the server runs in a step below).
* cgroup v1: ``memory.oom_control`` (its ``oom_kill`` line, kernels 4.13 and newer),
  ``memory.limit_in_bytes``, ``memory.usage_in_bytes``; on an older kernel without the
  ``oom_kill`` line ``oom_kills`` is null and ``last_oom_kill_at`` is when ``memory.failcnt``
  (the times usage hit the limit) last rose: the best evidence such a kernel gives.
* A limit of "max" or 2**60 or more is no limit (null). ``WORKBENCH_MEMORY_CGROUP=<dir>``
  reads another directory (tests use a fake one); otherwise the server's own cgroup from
  ``/proc/self/cgroup``.

The reader (``read_cgroup`` and the ``parse_*`` functions) is plain: files in, values out.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # tornado is imported where the watcher starts, not when this module is read
    from tornado.ioloop import PeriodicCallback

CGROUP_ENV = "WORKBENCH_MEMORY_CGROUP"
CGROUP_ROOT = "/sys/fs/cgroup"
NO_LIMIT = 2**60
V2_FILES = ("memory.events", "memory.max", "memory.current")
V1_FILES = ("memory.oom_control", "memory.failcnt", "memory.limit_in_bytes", "memory.usage_in_bytes")


@dataclass(frozen=True)
class Reading:
    cgroup: str | None = None
    limit_bytes: int | None = None
    usage_bytes: int | None = None
    oom_kills: int | None = None
    # v1 without an oom_kill line: memory.failcnt, the fallback evidence.
    limit_hits: int | None = None
    source: str | None = None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _limit(text: str | None) -> int | None:
    value = _int(text)
    if value is None or value >= NO_LIMIT or value < 0:
        return None  # "max", unreadable, or the kernel's "no limit" (page-rounded LONG_MAX on v1)
    return value


def _keyed(text: str | None, key: str) -> int | None:
    """The number after ``key`` in a flat-keyed file such as memory.events or memory.oom_control."""
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return _int(parts[1])
    return None


def parse_v2(files: Mapping[str, str | None], source: str | None = None, parent_limits=()) -> Reading:
    limits = [v for v in [_limit(files.get("memory.max")), *(_limit(t) for t in parent_limits)] if v is not None]
    return Reading(
        cgroup="v2",
        limit_bytes=min(limits) if limits else None,
        usage_bytes=_int(files.get("memory.current")),
        oom_kills=_keyed(files.get("memory.events"), "oom_kill"),
        source=source,
    )


def parse_v1(files: Mapping[str, str | None], source: str | None = None) -> Reading:
    return Reading(
        cgroup="v1",
        limit_bytes=_limit(files.get("memory.limit_in_bytes")),
        usage_bytes=_int(files.get("memory.usage_in_bytes")),
        oom_kills=_keyed(files.get("memory.oom_control"), "oom_kill"),
        limit_hits=_int(files.get("memory.failcnt")),
        source=source,
    )


def _read(directory: str, name: str) -> str | None:
    try:
        with open(os.path.join(directory, name), encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def read_cgroup(directory: str | None, limit_parents: tuple[str, ...] = ()) -> Reading:
    """One reading of the memory cgroup in ``directory``: v2 or v1 by the files it has, else nothing."""
    if not directory:
        return Reading()
    v2 = {name: _read(directory, name) for name in V2_FILES}
    if any(v is not None for v in v2.values()):
        return parse_v2(v2, directory, tuple(_read(p, "memory.max") for p in limit_parents))
    v1 = {name: _read(directory, name) for name in V1_FILES}
    if any(v is not None for v in v1.values()):
        return parse_v1(v1, directory)
    return Reading()


def find_cgroup(
    environ: Mapping[str, str], proc_self_cgroup: str | None, root: str = CGROUP_ROOT
) -> tuple[str | None, tuple[str, ...]]:
    """The server's memory cgroup directory and (v2) the parents whose ``memory.max`` also limits it."""
    override = environ.get(CGROUP_ENV)
    if override:
        return override, ()
    v2_path = v1_path = None
    for line in (proc_self_cgroup or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif "memory" in parts[1].split(","):
            v1_path = parts[2]
    if v2_path is not None and os.path.exists(os.path.join(root, "cgroup.controllers")):
        leaf = os.path.normpath(os.path.join(root, v2_path.lstrip("/")))
        if not os.path.exists(os.path.join(leaf, "memory.current")):
            leaf = root  # a cgroup namespace shows "/" while the mount is the container's own
        parents = []
        parent = os.path.dirname(leaf)
        while parent.startswith(root.rstrip("/") + "/") or parent == root:
            parents.append(parent)
            if parent == root:
                break
            parent = os.path.dirname(parent)
        return leaf, tuple(parents)
    v1_root = os.path.join(root, "memory")
    if os.path.isdir(v1_root):
        leaf = os.path.normpath(os.path.join(v1_root, (v1_path or "/").lstrip("/")))
        return (leaf if os.path.exists(os.path.join(leaf, "memory.usage_in_bytes")) else v1_root), ()
    return None, ()


class MemoryWatcher:
    """Reads the cgroup each second (``poll``) and remembers when the OOM-kill count last rose."""

    def __init__(
        self,
        directory: str | None,
        limit_parents: tuple[str, ...] = (),
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.directory = directory
        self.limit_parents = limit_parents
        self.now = now
        self.latest: Reading | None = None
        self.last_oom_kill_at: datetime | None = None
        self._timer: PeriodicCallback | None = None

    @classmethod
    def for_this_server(cls, environ: Mapping[str, str] = os.environ) -> MemoryWatcher:
        return cls(*find_cgroup(environ, _read("/proc/self", "cgroup")))

    def poll(self) -> Reading:
        reading = read_cgroup(self.directory, self.limit_parents)
        previous = self.latest
        if previous is not None:
            kills = (previous.oom_kills, reading.oom_kills)
            if reading.oom_kills is None:  # v1 without an oom_kill line: the limit was hit
                kills = (previous.limit_hits, reading.limit_hits)
            if kills[0] is not None and kills[1] is not None and kills[1] > kills[0]:
                self.last_oom_kill_at = self.now()
        self.latest = reading
        return reading

    def snapshot(self) -> dict:
        reading = self.latest or self.poll()
        return {
            "cgroup": reading.cgroup,
            "limit_bytes": reading.limit_bytes,
            "usage_bytes": reading.usage_bytes,
            "oom_kills": reading.oom_kills,
            "last_oom_kill_at": self.last_oom_kill_at.isoformat() if self.last_oom_kill_at else None,
            "source": reading.source,
        }

    def start(self, interval_ms: int = 1000) -> None:
        """Poll on the server's event loop: a few small file reads a second, no thread."""
        from tornado.ioloop import PeriodicCallback

        self.poll()
        self._timer = PeriodicCallback(self._poll_quietly, interval_ms)
        self._timer.start()

    def _poll_quietly(self) -> None:
        # A file that vanished or held something odd: the next poll reads again. Anything else is a bug, which
        # PeriodicCallback logs, and it still calls again: the watching never stops.
        with contextlib.suppress(OSError, ValueError):
            self.poll()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
