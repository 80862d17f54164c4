"""The local backend: user servers as processes on the hub's own machine.

For one trusted workstation or a try-out (`make run`). Servers run as the
hub's own system user with a home under the data dir; a GPU is pinned only
through ``CUDA_VISIBLE_DEVICES``, so a user who unsets it can reach every GPU.
That is isolation by convention, not enforcement: use the docker backend
where users do not trust each other.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from jupyterhub.spawner import SimpleLocalProcessSpawner
from traitlets import Unicode, default

from workbench_spawner import slugs
from workbench_spawner.ledger.store import Lease
from workbench_spawner.mixin import GPUSpawnerMixin
from workbench_spawner.policy.config import default_data_dir


class LocalGPUSpawner(GPUSpawnerMixin, SimpleLocalProcessSpawner):
    """Local processes pinned to their GPUs by CUDA_VISIBLE_DEVICES (host placement).

    Reconcile rule after a hub restart: a lease whose process is gone (or
    whose pid now runs something that is not Jupyter) is released; a local
    server cannot run without the hub's knowledge, so there are no orphans.
    """

    workbench_backend = "local"
    placement_mode = "host"

    @default("home_dir_template")
    def _default_home_dir_template(self):
        return os.path.join(os.path.abspath(default_data_dir()), "homes", "{username}")

    @default("home_dir")
    def _default_home_dir(self):
        # The collision-free slug, or the user's existing home under the old
        # mapping where that is unambiguously theirs (slugs.home_dir says when).
        choice = slugs.home_dir(self.home_dir_template, self.user.name)
        if choice.warning:
            self.log.warning(choice.warning)
        return choice.path

    starter_notebooks_dir = Unicode(
        help="""
        Folder of starter notebooks copied into ``~/notebooks`` of each user
        when their server starts. Only files the user does not have yet are
        copied, so an edited notebook is never overwritten. Empty: copy none.
        """,
    ).tag(config=True)

    async def prepare_server(self) -> None:
        if self.starter_notebooks_dir:
            # File copies block: off the event loop, like every database call of a spawn.
            await asyncio.to_thread(copy_missing, Path(self.starter_notebooks_dir), Path(self.home_dir) / "notebooks")

    def get_args(self):
        args = super().get_args()
        if os.geteuid() == 0:
            # The server runs as the hub's own user; in a root container or
            # CI that is root, which Jupyter refuses without this flag.
            args.append("--ServerApp.allow_root=True")
        return args

    def gpu_environment(self, uuids: list[str]) -> dict[str, str]:
        # An empty CUDA_VISIBLE_DEVICES hides every GPU: a CPU-only server
        # must not see the cards other users hold.
        return {"CUDA_VISIBLE_DEVICES": ",".join(uuids), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

    def gpu_lease_ref(self) -> str:
        return f"pid:{self.pid}" if self.pid else ""

    def gpu_lease_alive(self, lease: Lease) -> bool | None:
        if not lease.ref.startswith("pid:"):
            return False  # the start never finished before the hub went away
        return pid_runs_jupyter(int(lease.ref[4:]))

    def gpu_reconcile_orphans(self) -> None:
        """Nothing to adopt: a local server is a child of the hub, and ends with it unless it was leased."""


def pid_runs_jupyter(pid: int) -> bool:
    """True if ``pid`` is alive and is a Jupyter server, not a recycled pid."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ")
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z" and b"jupyter" in cmdline


def safe_dir_name(name: str) -> str:
    """A user name as one path component, different for every name.

    No separators, no dot tricks, and collision-free by construction (the
    escape character is escaped too); the rule and its proof are in slugs.py.
    """
    return slugs.dir_slug(name)


def copy_missing(source: Path, target: Path) -> list[Path]:
    """Copy files from ``source`` that ``target`` lacks; never overwrite."""
    copied = []
    if not source.is_dir():
        return copied
    for path in sorted(source.rglob("*")):
        # Editor and interpreter droppings stay behind (the shared timing module is imported by tests).
        if not path.is_file() or {".ipynb_checkpoints", "__pycache__"} & set(path.relative_to(source).parts):
            continue
        dest = target / path.relative_to(source)
        if dest.exists():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
        copied.append(dest)
    return copied
