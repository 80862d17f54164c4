"""The local backend: user servers as processes on the hub's own machine.

For one trusted workstation or a try-out (`make run`). Servers run as the
hub's own system user with a home under the data dir; a GPU is pinned only
through ``CUDA_VISIBLE_DEVICES``, so a user who unsets it can reach every GPU.
That is isolation by convention, not enforcement: use the docker backend
where users do not trust each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from pathlib import Path

from jupyterhub.spawner import SimpleLocalProcessSpawner
from traitlets import Unicode, default, observe

from workbench_spawner import slugs
from workbench_spawner.ledger import endings
from workbench_spawner.ledger.endings import Ending
from workbench_spawner.ledger.reconcile_book import SERVER_ADOPTED, SERVER_STOPPED
from workbench_spawner.ledger.store import Lease
from workbench_spawner.mixin import GPUSpawnerMixin
from workbench_spawner.policy.config import default_data_dir

# The server processes this hub process launched, by pid: their exit codes are this process's to read.
_launched_here: set[int] = set()


class LocalGPUSpawner(GPUSpawnerMixin, SimpleLocalProcessSpawner):
    """Local processes pinned to their GPUs by CUDA_VISIBLE_DEVICES (host placement).

    Reconcile rule after a hub restart: a lease whose process is gone (or
    whose pid now runs something that is not Jupyter) is released. A server
    of this hub that runs without a lease (its lease row or the hub's own
    record of it was lost) is found by its environment (``hub_servers``) and
    adopted if its GPUs are free, else ended: its GPUs are someone else's.
    """

    workbench_backend = "local"
    placement_mode = "host"

    @default("interrupt_timeout")
    def _default_interrupt_timeout(self):
        # The server ends on SIGINT after its kernels did (each gets kernel_stop_grace to checkpoint, see
        # on_stop): JupyterHub's 10 s before SIGTERM and SIGKILL would cut a checkpoint short.
        return int(self.kernel_stop_grace + self.server_stop_margin)

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

    def gpu_lease_gone_reason(self, lease: Lease) -> Ending | None:
        """What the poll says: a server this hub process launched ended with the exit code read from its
        process (left for the poll to reap, ``exit_status``), or with none once its poll reaped it (that poll
        tells the code); any other was started before a restart, and its exit code is unknown. A lease that
        never named its process (the start did not finish) has no reason to give."""
        if not lease.ref.startswith("pid:"):
            return None
        pid = int(lease.ref[4:])
        code = exit_status(pid)
        if code is not None:
            return endings.server_exited(code)
        return endings.server_exited() if pid in _launched_here else endings.server_exited_after_restart()

    @observe("proc")
    def _note_launch(self, change) -> None:
        if change.new is not None:
            _launched_here.add(change.new.pid)

    async def gpu_exit_reason(self) -> Ending | None:
        """The exit code of a process this hub process started, as its poll read it (``proc``). A server the
        hub re-attached to after a restart has no process handle: JupyterHub's poll then answers 0, its
        "unknown", and the ending says the code is unknown rather than take that 0 for one."""
        if self.proc is None:
            return endings.server_exited_after_restart()
        return endings.server_exited(self.proc.returncode)

    def gpu_reconcile_orphans(self) -> None:
        """Adopt or end this hub's server processes that hold GPUs and have no lease.

        Runs on every pass of the reconciler while the hub runs, so a process is
        an orphan only when, asked again just before acting, its server holds no
        lease and is not starting (``GPUPolicy.orphan_now``: a process forked by a
        start whose lease has no ref yet is not one) and it still runs (a server
        being stopped has ended before its lease is released)."""
        policy = self.gpu_policy
        store = policy.store
        leased = {lease.ref for lease in store.leases()}
        for pid, env in hub_servers(self.hub.api_url):
            uuids = [u for u in env.get("WORKBENCH_GPUS", "").split(",") if u]
            user, server = env.get("JUPYTERHUB_USER", ""), env.get("JUPYTERHUB_SERVER_NAME", "")
            if f"pid:{pid}" in leased or not uuids or not user:
                continue
            if not policy.orphan_now(user, server) or not pid_runs_jupyter(pid):
                continue
            if store.adopt(user, server, uuids, f"pid:{pid}", shares=policy.shares()):
                policy.record_fix(
                    SERVER_ADOPTED,
                    f"reconcile: adopted server process {pid} of {user}/{server} on {', '.join(uuids)}: "
                    "it ran without a lease and its GPU(s) were free",
                )
                continue
            policy.record_fix(
                SERVER_STOPPED,
                f"reconcile: ended server process {pid} of {user}/{server}: it ran without a lease and its "
                f"GPU(s) {', '.join(uuids)} are leased to another server",
            )
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.kill(pid, signal.SIGTERM)


def hub_servers(api_url: str) -> list[tuple[int, dict[str, str]]]:
    """The running single-user servers of the hub at ``api_url``, with their environments.

    A server is a Jupyter process whose ``JUPYTERHUB_API_URL`` is this hub's
    (another hub on the machine has another API address) and whose parent is
    not one: its kernels and terminals inherit the same environment. Only
    processes this account may read are seen, which are the ones it started.
    """
    found: dict[int, tuple[int, dict[str, str]]] = {}
    for entry in Path("/proc").iterdir():
        parent = jupyter_parent(int(entry.name)) if entry.name.isdigit() else None
        if parent is None:
            continue
        try:
            raw = (entry / "environ").read_bytes()
        except OSError:
            continue
        env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        if env.get("JUPYTERHUB_API_URL") == api_url:
            found[int(entry.name)] = (parent, env)
    return sorted((pid, env) for pid, (parent, env) in found.items() if parent not in found)


def pid_runs_jupyter(pid: int) -> bool:
    """True if ``pid`` is alive and is a Jupyter server, not a recycled pid."""
    return jupyter_parent(pid) is not None


def exit_status(pid: int) -> int | None:
    """The exit code of ``pid`` if it is a child of this process that ended and was not reaped yet, as
    ``Popen.returncode`` says it (minus the signal that killed it); None for a running process or one this
    process did not start (only a parent reads an exit code). Read with ``WNOWAIT``: the process stays
    unreaped, so the poll of the spawner that started it reads the same code."""
    try:
        ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # not this process's child, or reaped already
        return None
    if ended is None:  # still running
        return None
    return ended.si_status if ended.si_code == os.CLD_EXITED else -ended.si_status


def jupyter_parent(pid: int) -> int | None:
    """The parent pid of ``pid`` if it is a live (not zombie) Jupyter process, else None."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ")
        with open(f"/proc/{pid}/stat", "rb") as f:
            state, parent = f.read().rsplit(b")", 1)[1].split()[:2]
    except (OSError, ValueError):
        return None
    return int(parent) if state != b"Z" and b"jupyter" in cmdline else None


def safe_dir_name(name: str) -> str:
    """A user name as one path component, different for every name.

    No separators, no dot tricks, and collision-free by construction (the
    escape character is escaped too); the rule and its proof are in slugs.py.
    """
    return slugs.dir_slug(name)


def copy_missing(source: Path, target: Path) -> list[Path]:
    """Copy files from ``source`` that ``target`` lacks; never overwrite."""
    copied: list[Path] = []
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
