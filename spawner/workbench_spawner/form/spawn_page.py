"""The spawn page's form for one server: everything it shows read in one worker-thread hop, then rendered.

``GPUSpawnerMixin._render_options_form`` (JupyterHub's ``options_form``)
calls ``spawn_page``; the form of a named server (``/hub/spawn/USER/SERVER``)
is the same form, for that server. Everything the form shows is read in ONE
hop (the default executor's few threads also run every spawn's database work:
at a class start each hop waits in that queue), each table once: the leases
feed the free counts, what the user holds on each of their servers, the
GPU-hours and the reservation lines alike. Above the form goes the box that
says why this server stopped last (GPU idle, a reservation).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from workbench_spawner.form.render import render_options_form
from workbench_spawner.form.servers import held_by_server
from workbench_spawner.ledger.notices import Notice, NoticeBook, render_stop_notice
from workbench_spawner.policy.gpu_policy import GPUPolicy, GPUStatus
from workbench_spawner.rules.admission import AdmissionContext


@dataclass(frozen=True)
class FormReads:
    """What one render of the form read (blocking, in a worker thread)."""

    policy: GPUPolicy
    source: str
    message: str
    ctx: AdmissionContext
    status: list[GPUStatus]
    held: dict[str, int]
    reserved: list[str]
    stopped: Notice | None


def read_form(spawner: Any) -> FormReads:
    """The reads of one render, for ``spawner`` (a ``GPUSpawnerMixin``); blocking."""
    policy = spawner.gpu_policy
    inventory = policy.inventory  # a backend may read it from the database (Slurm's reported UUIDs)
    leases = policy.store.leases()
    status = policy.status(leases=leases, inventory=inventory)
    user, server = spawner.user.name, spawner.name
    return FormReads(
        policy=policy,
        source=inventory.source,
        message=inventory.message,
        ctx=spawner.gpu_admission_context(policy, leases=leases, status=status, inventory=inventory),
        status=status,
        held=held_by_server(user, leases),
        # What the open reservations keep, in words ("8 of 16 GPUs reserved for ml-course until 12:00").
        reserved=spawner.gpu_reserved_now(policy, leases=leases, inventory=inventory),
        stopped=NoticeBook(policy.store).last_done(user, server),
    )


async def spawn_page(spawner: Any) -> str:
    """The form's HTML for ``spawner``'s server: the stop box of its last stop, then the form."""
    reads = await asyncio.to_thread(read_form, spawner)
    return render_stop_notice(reads.stopped) + render_options_form(
        user=spawner.user.name,
        server=spawner.name,
        named_servers=bool(getattr(spawner.user, "allow_named_servers", False)),
        ctx=reads.ctx,
        status=reads.status,
        source=reads.source,
        message=reads.message,
        shared=reads.policy.shared,
        profiles=spawner.gpu_profiles,
        limits_enforced=spawner.enforces_resource_limits,
        held=reads.held,
        reserved=reads.reserved,
    )
