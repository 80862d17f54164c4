"""What the spawn form says about the student's servers: which one this form starts, which holds each GPU.

With JupyterHub's named servers (``WORKBENCH_NAMED_SERVERS``) a student may
run a GPU server for training beside a CPU server for writing, and every
server counts against the same quota. The form must then say which server it
starts ("Starting server big") and where the GPUs the student holds are
("You hold 2 GPUs now: 1 on big, 1 on small"; a GPU's row reads
"yours: big"), so "you hold 2 of 2" is not a riddle.

A student with only the default server reads the form as before ("You hold
1 GPU now.", "yours"): servers are named only where more than one may be.
Pure functions of the leases the form's snapshot read once; nothing here
touches the database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workbench_spawner.ledger.store import Lease
from workbench_spawner.policy.gpu_policy import GPUStatus

DEFAULT_SERVER = "default server"


def server_label(name: str) -> str:
    """How the form names a server: its name, or "default server" for JupyterHub's unnamed one."""
    return name or DEFAULT_SERVER


def held_by_server(user: str, leases: Sequence[Lease]) -> dict[str, int]:
    """Server name -> the devices it holds, for ``user``'s servers that hold any, in the order they got them."""
    held: dict[str, int] = {}
    for lease in leases:
        if lease.user == user and lease.gpu_uuids:
            held[lease.server] = held.get(lease.server, 0) + len(lease.gpu_uuids)
    return held


def names_servers(server: str, held: Mapping[str, int]) -> bool:
    """Whether the form names servers: it starts a named server, or one of the user's named servers holds GPUs."""
    return bool(server) or any(held)


def held_sentence(held: Mapping[str, int], naming: bool) -> str:
    """ "You hold 1 GPU now." or, naming servers, "You hold 2 GPUs now: 1 on big, 1 on your default server." """
    total = sum(held.values())
    text = f"You hold {total} GPU{'' if total == 1 else 's'} now"
    if naming and held:
        text += ": " + ", ".join(f"{count} on {name or 'your ' + DEFAULT_SERVER}" for name, count in held.items())
    return text + "."


def starting_sentence(server: str) -> str:
    """ "Starting server big." or "Starting your default server." """
    return f"Starting server {server}." if server else f"Starting your {DEFAULT_SERVER}."


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def gpu_state(status: GPUStatus, user: str, naming: bool) -> str:
    """One GPU's state on the form's table, for ``user``: free, in use, shared, draining, unavailable, or
    "yours" (naming servers: "yours: big", "yours: big and small" for a time-sliced GPU two of them hold)."""
    mine = list(dict.fromkeys(server_label(server) for holder, server in status.holders if holder == user))
    which = f" ({' and '.join(mine)})" if naming else ""
    if status.unavailable:
        return f"unavailable: {status.unavailable}" + (f", held by you{which}" if mine else "")
    if status.drained:
        return "draining (no new servers)" + (f", in use by you{which}" if mine else "")
    if status.free_slots == status.slots:
        shared = f" (time-sliced: up to {status.slots} servers)" if status.slots > 1 else ""
        return "free" + shared
    others = sum(1 for holder, _ in status.holders if holder != user)
    if mine:
        text = "yours" + (f": {' and '.join(mine)}" if naming else "")
        if others:
            text += f", shared with {_plural(others, 'other')}"
    elif status.free_slots:
        text = f"shared with {_plural(others, 'other')}"
    else:
        text = "in use"
    if status.free_slots:
        text += f", {_plural(status.free_slots, 'slot')} left"
    return text
