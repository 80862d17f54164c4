"""A spawn refused with the rule's sentence, the same sentence wherever JupyterHub shows the failure.

JupyterHub 6 shows a failed spawn on the spawn-pending page through its
progress stream. While the page follows a spawn that fails, the message is the
exception's own; but when the page connects after the spawn already failed
(a refusal that came at once, a loaded hub), it formats the exception with
``format_exception``, which falls back to ``str(exc)``, and ``SpawnException``'s
``__str__`` is its log form: "403 SpawnException(reason=quota): Cannot start
the server: ...". ``format_exception`` reads ``jupyterhub_message`` first, so
every refusal of the GPU policy carries its sentence there.
"""

from __future__ import annotations

from jupyterhub.spawner import SpawnException


def refused(message: str, *, reason: str, status: int) -> SpawnException:
    """A ``SpawnException`` whose message is ``message`` in every view of the failure (see the module)."""
    exc = SpawnException(message, reason=reason, status_code=status)
    exc.jupyterhub_message = message
    return exc
