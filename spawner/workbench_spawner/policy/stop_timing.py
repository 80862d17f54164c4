"""How long a stop takes, and what the stop box may say about the idle culler: a base of GPUSpawnerMixin.

Every backend stops a server in two steps: its kernels get
``kernel_stop_grace`` seconds between SIGTERM and SIGKILL to write a
checkpoint, then the server gets ``server_stop_margin`` more to exit before
the backend kills it. The hub's idle culler's timeout (``idle_culler_seconds``)
is here too, because it is only ever read when a stop is explained. Kept
apart from the spawner's life cycle (``mixin.py``) so the traits can be read
and documented without it; they stay configured as ``c.GPUSpawnerMixin.*``
(a config section applies to every base of the class it names).
"""

from __future__ import annotations

from traitlets import Float, Integer
from traitlets.config import Configurable


class StopTiming(Configurable):
    """The stop's timing traits; a base of GPUSpawnerMixin."""

    idle_culler_seconds = Integer(
        0,
        min=0,
        help="""
        The idle culler's ``--timeout`` in seconds, when the hub runs one (the
        host config sets it from ``WORKBENCH_CULL_IDLE_SECONDS``), so the stop
        box can tell a student "the hub's idle culler stopped this server after
        60 minutes without activity". 0: the sentence names no time.
        """,
    ).tag(config=True)

    kernel_stop_grace = Float(
        30.0,
        min=0,
        help="""
        Seconds a stopping server gives its kernels between SIGTERM and
        SIGKILL, so a training loop can write a checkpoint
        (``workbench_gpu_monitor.on_stop``, notebooks/05-checkpoint-resume).
        The server reads it as ``WORKBENCH_KERNEL_GRACE``; each backend's own
        stop waits this long plus ``server_stop_margin`` before it kills the
        server (local: SIGINT/SIGTERM timeouts, docker: the container's stop
        timeout, Kubernetes: the pod's deletion grace period; Slurm: the
        cluster's ``KillWait``, docs/slurm.md). Set from ``WORKBENCH_KERNEL_GRACE``.
        """,
    ).tag(config=True)

    server_stop_margin = Float(
        15.0,
        min=0,
        help="""
        Seconds a backend's stop waits beyond ``kernel_stop_grace`` for the
        server itself to end after its kernels (it saves nothing more; it
        closes its connections and exits) before it is killed.
        """,
    ).tag(config=True)
