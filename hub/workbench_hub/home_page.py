"""The hub's home page lists the student's servers, each with its GPUs and its state, and why it stopped.

JupyterHub 6 renders ``/hub/home`` from ``home.html``. Ours
(``templates/home.html`` beside this file) extends JupyterHub's own
(``templates/home.html``, JupyterHub's prefix loader for its built-in pages)
and puts, above it, a table of the user's servers: the default one and, where
the hub allows them (``WORKBENCH_NAMED_SERVERS``), each named one. A student
with a GPU server for training beside a CPU server for writing reads there
which holds what:

* **GPUs**: the devices its lease holds (the GPU database's ledger), by model
  and GPU index, a MIG slice by its profile ("1g.18gb slice of H200-141GB
  (GPU 0)"), on which node where an engine places; "simulated" where the
  inventory is; "none (CPU only)" for a server that holds none; what a
  server waiting for GPUs asked for;
* **state**: "running", "starting", "stopping", "waiting in line for 1 GPU:
  place 2 of 3" (the host placement's wait list, in this hub process), for an
  engine "waiting for the engine: <its words>" (the spawn's newest progress
  event, as the spawn page shows it), or, for a server that is not running,
  the spawn page's stop box (``render_stop_notice``) for its newest ``done``
  notice. Starting a server forgets its notice (``NoticeBook.acknowledge``),
  so the box stays until the next start.

The data comes through ``JupyterHub.template_vars``, whose callable values
JupyterHub 6 calls with the current user for every page it renders. Ours
returns a lazy value (``ServerPanel``) whose ``rows()`` only the home page
calls; JupyterHub renders its pages with Jinja's async mode, which awaits the
coroutine. A render reads the GPU database once, in one worker thread (the
user's leases and the notices of their servers that are not running); the
server states and the wait list are read on the event loop, where they live.
Names are escaped by the hub's own Jinja environment (autoescape).

``update_home_page(c, db_url)`` wires it, after the authenticator's and the
site's template paths (a site's own ``home.html`` still wins); the end of
the hub's config (``finish.py``, on a host and in the z2jh chart's hub pod)
calls it once the GPU database's URL is settled.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from markupsafe import Markup
from traitlets.config import Config

from workbench_devices import GPUDevice
from workbench_spawner.form.servers import server_label
from workbench_spawner.ledger.notices import Notice, NoticeBook, render_stop_notice
from workbench_spawner.ledger.store import AllocationStore, Lease
from workbench_spawner.rules.reservations import gpus_text

log = logging.getLogger("workbench.hub")

TEMPLATES = Path(__file__).parent / "templates"
VARIABLE = "workbench_servers"


@dataclass(frozen=True)
class ServerRow:
    """One server as the home page shows it."""

    name: str  # "" for the default server
    label: str
    url: str  # where it runs, while it runs; "" otherwise
    gpus: str
    simulated: bool
    state: str
    stop_box: Markup  # why it stopped (the spawn page's box), for a server that is not running


@dataclass(frozen=True)
class Reads:
    """What one render read in its worker thread."""

    leases: dict[str, Lease]
    notices: dict[str, Notice | None]
    devices: dict[str, GPUDevice]
    engine: bool
    policy: Any  # the hub's GPU policy (its wait list), or None where no GPU spawner is loaded


def describe_gpus(lease: Lease | None, devices: Mapping[str, GPUDevice], engine: bool) -> tuple[str, bool]:
    """(what a lease holds in words, whether any of it is simulated): "H100-80GB (GPU 0), H100-80GB (GPU 1)",
    "1g.18gb slice of H200-141GB (GPU 0)", "none (CPU only)" for a server without a lease."""
    if lease is None or not lease.gpu_uuids:
        return "none (CPU only)", False
    words = []
    simulated = False
    for uuid in lease.gpu_uuids:
        device = devices.get(uuid)
        if device is None:  # a device the inventory does not list (any more): its UUID is all there is
            words.append(uuid)
            continue
        simulated = simulated or device.simulated
        words.append(gpu_words(device))
    on = f" on {lease.node}" if engine and lease.node else ""
    return ", ".join(words) + on, simulated


def gpu_words(device: GPUDevice) -> str:
    """One device as the home page and My GPUs name it: "H100-80GB (GPU 0)", "1g.18gb slice of H200-141GB (GPU 0)"."""
    model = device.model or device.name
    return f"{device.profile} slice of {model} (GPU {device.index})" if device.mig else f"{model} (GPU {device.index})"


def asked_for(spawner: Any) -> str:
    """What a starting server asked for, before it holds anything: "asks for 2 GPUs", "none (CPU only)"."""
    request = getattr(spawner, "gpu_request", None)
    if request is None or not request.gpus:
        return "none (CPU only)"
    return f"asks for {gpus_text(request.gpus, request.kind)}"


def place_in_line(policy: Any, user: str, server: str) -> str:
    """ "waiting in line for 1 GPU: place 2 of 3", where the host placement's wait list holds this server's
    spawn (read on the event loop, where the list lives); "" when it is not in line."""
    waitlist = getattr(getattr(policy, "placement", None), "waitlist", None)
    if waitlist is None:
        return ""
    tickets = waitlist.waiting()
    key = f"{user}/{server}"
    for place, ticket in enumerate(tickets, start=1):
        if ticket.key == key:
            return f"waiting in line for {gpus_text(ticket.count, None)}: place {place} of {len(tickets)}"
    return ""


def server_state(spawner: Any, policy: Any, user: str, server: str) -> str:
    """The state of a server that is active: running, stopping, or how its start is coming along."""
    pending = getattr(spawner, "pending", None)
    if pending == "stop":
        return "stopping"
    if pending != "spawn":
        return "running" if getattr(spawner, "ready", False) else "starting"
    if getattr(spawner, "placement_mode", "") == "engine":
        words = spawner.gpu_start_words() if hasattr(spawner, "gpu_start_words") else ""
        return f"waiting for the engine: {words}" if words else "starting"
    return place_in_line(policy, user, server) or "starting"


class ServerTable:
    """The home page's reads, one per hub process; the GPU database opened on first use."""

    def __init__(self, db_url: str):
        self.db_url = db_url
        self._store: AllocationStore | None = None
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> ServerTable:
        # traitlets copies config values; one process-wide reader (and its lock) is what every copy means.
        return self

    @property
    def store(self) -> AllocationStore:
        with self._lock:
            if self._store is None:
                self._store = AllocationStore(self.db_url)
            return self._store

    def read(self, user: str, stopped: Sequence[str], source: Any) -> Reads:
        """The user's leases, the newest ``done`` notice of each server in ``stopped``, and the devices by
        UUID (blocking: one worker thread per render). ``source``: a GPU spawner of the user, whose policy
        knows the inventory in force and the wait list; None: the leases and notices only."""
        policy = source.gpu_policy if source is not None else None
        store = policy.store if policy is not None else self.store
        leases = {lease.server: lease for lease in store.leases_of(user)}
        book = NoticeBook(store)
        notices = {name: book.last_done(user, name) for name in stopped}
        devices = {d.uuid: d for d in policy.inventory.devices} if policy is not None else {}
        engine = getattr(source, "placement_mode", "") == "engine"
        return Reads(leases, notices, devices, engine, policy)

    def __call__(self, user: Any) -> ServerPanel | str:
        return "" if user is None else ServerPanel(self, user)


class ServerPanel:
    """The current user's servers: ``rows()`` is called (and awaited) by the home page only, so no other page
    reads the GPU database."""

    def __init__(self, table: ServerTable, user: Any):
        self.table = table
        self.user = user

    async def rows(self) -> list[ServerRow]:
        try:
            return await self._rows()
        except Exception as exc:  # noqa: BLE001 - boundary: the home page must render whatever the GPU database does
            log.warning("The home page's servers of %s could not be read: %s", getattr(self.user, "name", "?"), exc)
            return []

    async def _rows(self) -> list[ServerRow]:
        user = self.user
        named = bool(getattr(user, "allow_named_servers", False))
        names = [""] + (sorted(name for name in user.orm_user.orm_spawners if name) if named else [])
        spawners = {name: user.spawners.get(name) for name in names}
        active = {name for name, spawner in spawners.items() if spawner is not None and spawner.active}
        source = next((s for s in spawners.values() if s is not None and hasattr(type(s), "gpu_policy")), None)
        reads = await asyncio.to_thread(self.table.read, user.name, [n for n in names if n not in active], source)
        rows = []
        for name in names:
            spawner = spawners[name]
            label = server_label(name)
            if name in active:
                lease = reads.leases.get(name)
                state = server_state(spawner, reads.policy, user.name, name)
                if lease is None and spawner.pending == "spawn":
                    gpus, simulated = asked_for(spawner), False
                else:
                    gpus, simulated = describe_gpus(lease, reads.devices, reads.engine)
                url = user.server_url(name) if getattr(spawner, "ready", False) else ""
                rows.append(ServerRow(name, label, url, gpus, simulated, state, Markup("")))
                continue
            notice = reads.notices.get(name)
            box = Markup(render_stop_notice(notice))
            rows.append(ServerRow(name, label, "", "", False, "stopped" if notice else "not running", box))
        # A hub without named servers whose one server never ran and has nothing to say: JupyterHub's page alone.
        if not named and not active and not any(row.stop_box for row in rows):
            return []
        return rows


def update_home_page(c: Config, db_url: str) -> None:
    """Our ``home.html`` after the template paths set so far, and the server table in ``template_vars``."""
    paths = list(c.JupyterHub.template_paths) if "template_paths" in c.JupyterHub else []
    if str(TEMPLATES) not in paths:
        paths.append(str(TEMPLATES))
    c.JupyterHub.template_paths = paths
    variables = dict(c.JupyterHub.template_vars) if "template_vars" in c.JupyterHub else {}
    c.JupyterHub.template_vars = {**variables, VARIABLE: ServerTable(db_url)}
