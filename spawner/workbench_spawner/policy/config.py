"""The GPU policy's configurable settings, as traits of one small class.

``GPUSpawnerMixin`` inherits them, so operators set them as spawner traits
(``c.GPUSpawnerMixin.default_max_gpus = 2``, ``c.LocalGPUSpawner.static_gpus``,
...), exactly as before. They live apart from the spawner because the hub
resolves them once at start (``settings.publish_policy_settings``) and stores
them for the workbench service: that needs the values the configured spawner
class would see, without making a spawner (a spawner needs a user).
"""

from __future__ import annotations

import os
import socket

from traitlets import Bool, Dict, Enum, Float, Integer, List, TraitError, Unicode, default, validate
from traitlets.utils.bunch import Bunch

from workbench_spawner.policy.idle_config import IdlePolicyConfig


def default_data_dir() -> str:
    return os.environ.get("WORKBENCH_DATA_DIR") or os.path.join(os.getcwd(), "data")


class GPUPolicyConfig(IdlePolicyConfig):  # idle-GPU traits: idle_config.py
    """The settings every part of the GPU policy must agree on; a base of GPUSpawnerMixin."""

    simulated_gpus = Unicode(
        help="""
        Pretend these GPUs exist instead of asking NVML, for CI, demos and laptops.

        A count (``"4"``: four H100-80GB) or a list such as
        ``"2xH100-80GB,2xA100-40GB"``. The simulated devices have stable UUIDs
        (``GPU-sim-00-h100-80gb``), and every page that shows them says
        "simulated". Empty (the default) means: use NVML, or run CPU-only
        servers when no driver is found. Defaults to $WORKBENCH_SIMULATED_GPUS.

        ``"@/path/to/file"`` reads the spec from that file, and the hub
        re-reads it like NVML (``inventory_refresh_seconds``): write another
        MIG layout there to watch the hub adopt it without a restart.
        """,
    ).tag(config=True)

    inventory_refresh_seconds = Float(
        60.0,
        min=0.0,
        help="""
        How often the hub asks NVML (or the simulated spec file, or
        ``static_gpus``) for its GPUs again, so a GPU whose MIG layout an admin
        changed (``workbench drain``, ``nvidia-smi mig``, ``workbench undrain``)
        is handed out as its new slices without a hub restart. The hub reads it
        on a timer of its own (also when nobody spawns), and at most as often
        when a spawn, a spawn form or a request waiting in line needs the
        policy. A GPU whose new layout would take a device from a running
        server keeps its old layout, closed to new servers, until those servers
        stop ("layout change waiting: ..." on the fleet page and ``api/gpus``).
        0 turns re-reading off (the inventory of the hub's start is kept).
        Only where the hub places GPUs itself (local, docker): Slurm and
        Kubernetes know their nodes' GPUs from the engine.
        The hub config sets it from ``WORKBENCH_INVENTORY_REFRESH_SECONDS`` (default 60).
        """,
    ).tag(config=True)

    reconcile_seconds = Float(
        30.0,
        min=0.0,
        help="""
        How often the hub's reconciler compares the GPU ledger with the servers
        that really run, and puts right what differs: a lease whose server is
        gone (its process killed, its container or pod deleted, its Slurm job
        cancelled outside the hub) is closed with the reason the backend gives,
        so its GPU is free again; a server of this hub that runs without a lease
        is adopted if its GPUs are free, otherwise stopped, so a GPU a live
        server uses is never handed to another. Spawns in flight are left alone.
        A pass also runs at once after an inventory change or an engine's watch
        reconnecting, and once at hub start. Every fix is logged in one line
        ("reconcile: closed the lease of ann/ on GPU-...: server gone") and
        counted in ``workbench_reconcile_fixes_total{kind}`` on the workbench
        service's /metrics.

        0 turns the timer off: passes run only at start and after inventory
        changes or engine reconnects; a server that dies then keeps its lease
        until its spawner's poll notices. Lower it (e.g. 5) where GPUs are
        scarce and servers are often ended outside the hub; each pass asks the
        backend's runtime once (the process table, Docker, ``squeue``, the
        Kubernetes API). The hub config sets it from
        ``WORKBENCH_RECONCILE_SECONDS`` (default 30).
        """,
    ).tag(config=True)

    @default("simulated_gpus")
    def _default_simulated_gpus(self) -> str:
        return os.environ.get("WORKBENCH_SIMULATED_GPUS", "")

    static_gpus = List(
        Dict(),
        help="""
        A fixed GPU list for hubs that cannot see the driver (the hub runs on a
        different machine or in a container without NVIDIA utilities).

        Each entry needs ``uuid`` and ``name``; ``memory_total_bytes``,
        ``model`` and ``index`` are optional. A MIG slice is listed with its
        ``profile`` (and optionally ``parent_uuid``, its GPU); ``model`` is
        then its GPU's model. Example::

            c.LocalGPUSpawner.static_gpus = [
                {"uuid": "GPU-5f3c...", "name": "NVIDIA A100-SXM4-40GB", "model": "A100-40GB"},
                {"uuid": "MIG-9a1e...", "name": "NVIDIA H200 MIG 1g.18gb", "model": "H200-141GB",
                 "profile": "1g.18gb", "parent_uuid": "GPU-77b0...", "index": 1},
            ]

        A slice may also give its ``gpu_instance_id`` (the ``GPU_I_ID`` that
        dcgm-exporter labels it with, ``nvidia-smi mig -lgi`` shows it), so
        idle reclaim can read it from ``dcgm_exporter_urls``.

        When set, it wins over NVML and ``simulated_gpus``.
        """,
    ).tag(config=True)

    gpu_node = Unicode(
        help="""
        The node this hub's GPUs are on, recorded on every lease and shown
        in the fleet view and metrics (``Hostname``). Defaults to this
        machine's host name; set it when the hub runs in a container whose
        host name is not the GPU host's.
        """,
    ).tag(config=True)

    @default("gpu_node")
    def _default_gpu_node(self) -> str:
        return socket.gethostname()

    gpu_db_url = Unicode(
        help="""
        SQLAlchemy URL of the database that holds GPU leases and the usage ledger.

        It must survive hub restarts: that is how running servers keep their
        GPUs. Defaults to $WORKBENCH_DB_URL, else a SQLite file ``workbench.sqlite``
        in $WORKBENCH_DATA_DIR (``./data``). Use PostgreSQL
        (``postgresql+psycopg://...``) when several processes share it.
        """,
    ).tag(config=True)

    @default("gpu_db_url")
    def _default_gpu_db_url(self) -> str:
        if os.environ.get("WORKBENCH_DB_URL"):
            return os.environ["WORKBENCH_DB_URL"]
        data_dir = default_data_dir()
        os.makedirs(data_dir, exist_ok=True)
        return "sqlite:///" + os.path.join(os.path.abspath(data_dir), "workbench.sqlite")

    servers_per_gpu = Integer(
        1,
        min=1,
        help="""
        How many servers may share one GPU. 1 (the default) is exclusive mode:
        a GPU belongs to at most one running server. Larger values time-slice a
        GPU between several servers, which suits intro courses with small
        models; the spawn form then marks GPUs as shared.
        ``servers_per_device`` sets it for some GPUs only.
        """,
    ).tag(config=True)

    servers_per_device = Dict(
        key_trait=Unicode(),
        value_trait=Integer(min=1),
        help="""
        Servers per GPU where it differs from ``servers_per_gpu``, keyed by
        a GPU model (``T4-16GB``), a MIG profile (``1g.18gb``: each slice of
        it) or one device's UUID; a UUID wins over a profile, a profile over
        a model. Keys are matched whatever their case, so two keys that differ
        only in case are refused; a key that names nothing of the hub's
        inventory is logged at start. Time-slice the small GPUs of a course
        and keep the big ones exclusive::

            c.GPUSpawnerMixin.servers_per_device = {"T4-16GB": 4, "GPU-5f3c...": 2}

        ``WORKBENCH_SERVERS_PER_GPU=1,T4-16GB=4`` says the same.
        """,
    ).tag(config=True)

    @validate("servers_per_device")
    def _check_servers_per_device(self, proposal: Bunch) -> dict[str, int]:
        value: dict[str, int] = proposal["value"]
        seen: dict[str, str] = {}
        for key in value:
            if key.lower() in seen:
                raise TraitError(
                    f"servers_per_device names {seen[key.lower()]!r} and {key!r}, the same GPUs whatever the "
                    "case: keep one"
                )
            seen[key.lower()] = key
        return value

    gpu_queue_timeout = Float(
        300.0,
        min=0,
        help="""
        Seconds a spawn waits in line for free GPUs before it is refused with
        a message. Spawns wait first come, first served, and the spawn page
        shows how many are ahead. 0 refuses at once when nothing is free. A
        spawn tried again within 15 minutes of its refusal keeps its first
        arrival (its place in line).
        """,
    ).tag(config=True)

    max_waiting_spawns = Integer(
        1000,
        min=1,
        help="""
        How many spawns may wait at once: for a GPU, for the engine (Slurm,
        Kubernetes) or for a start slot (``max_starting_servers``). A class of
        500 pressing Start in the same minute all get a place in line; past
        this many, a spawn is refused with a 503 that says how many are
        waiting. JupyterHub's own ``concurrent_spawn_limit`` (whose 429 says
        "Too many users trying to log in") is set above it by the hub config
        (policy/spawn_limits.py), unless a local config sets it.
        The hub config sets it from ``WORKBENCH_MAX_WAITING`` (default 1000).
        """,
    ).tag(config=True)

    max_starting_servers = Integer(
        0,
        min=0,
        help="""
        How many servers this host starts at once, from their GPUs to their
        first answer, where the hub places GPUs itself (local, docker). The
        others wait their turn, and their spawn page says "the host is starting
        N servers ahead of yours", instead of 200 JupyterLabs starting
        together and missing ``http_timeout``. 0 (the default) derives it: one
        per device a server can hold (GPU, MIG slice, share of a time-sliced
        GPU) plus 4, at most 2 per CPU core, at least 4. Engines start servers
        on their own nodes and are not limited by it.
        The hub config sets it from ``WORKBENCH_MAX_STARTING`` (default 0).
        """,
    ).tag(config=True)

    default_max_gpus = Integer(
        1,
        min=0,
        help="""
        How many GPUs one user may hold at once, over all their servers, when
        no quota says otherwise. Set it to the inventory size on a trusted
        single-team machine, or 0 to make servers CPU-only by default.
        """,
    ).tag(config=True)

    cpu_servers_allowed = Bool(
        True,
        help="""
        Whether users may start CPU-only servers (``gpus=0``). True (the
        default) keeps them allowed even when a GPU quota is 0 or a GPU-hours
        budget is spent, so students can still edit notebooks. Set it to False
        on a hub that exists only to hand out GPUs. Defaults from
        $WORKBENCH_CPU_SERVERS in the shipped config.
        """,
    ).tag(config=True)

    quota_contact = Unicode(
        "a hub admin",
        help="""
        Who a student should ask for more GPUs; named in every quota refusal,
        e.g. ``"your course staff (gpu-help@example.edu)"``.
        """,
    ).tag(config=True)

    gpu_queue_order = Enum(
        ["fifo", "fair-share"],
        default_value="fifo",
        help="""
        The order in which waiting spawns get GPUs. ``fifo`` (the default):
        first come, first served. ``fair-share``: the user with the fewest
        GPU-hours in the last 7 days first, equal usage by arrival, and a
        request that waited ``gpu_queue_aging_minutes`` goes ahead of all
        that did not (nobody starves). Set from $WORKBENCH_QUEUE_ORDER in the
        shipped config, which stops the hub on any other value.
        """,
    ).tag(config=True)

    gpu_queue_aging_minutes = Float(
        30.0,
        min=0,
        help="""
        Fair share's aging bound: once a request has waited this many minutes,
        nobody who arrived after it is served before it. Counted from the first
        time the user asked for this server: a spawn refused at
        ``gpu_queue_timeout`` and tried again within 15 minutes keeps its first
        arrival, so the bound holds although the timeout is shorter. Lower it
        for short classes; 0 makes fair share behave as first come, first served.
        From $WORKBENCH_QUEUE_AGING_MINUTES in the shipped config.
        """,
    ).tag(config=True)

    gpu_time_zone = Unicode(
        help="""
        The IANA time zone reservation windows are written in (``Tue 10:00-12:00``
        means 10:00 there), e.g. ``Europe/Berlin``. Defaults to
        $WORKBENCH_TIME_ZONE, else $TZ, else /etc/timezone, else UTC.
        """,
    ).tag(config=True)

    @default("gpu_time_zone")
    def _default_gpu_time_zone(self) -> str:
        from workbench_spawner.policy.clock import default_time_zone

        return os.environ.get("WORKBENCH_TIME_ZONE") or default_time_zone()

    @validate("gpu_time_zone")
    def _check_gpu_time_zone(self, proposal: Bunch) -> str:
        from workbench_spawner.policy.clock import ClockError, zone

        value: str = proposal["value"]
        try:
            zone(value)
        except ClockError as exc:
            raise TraitError(str(exc)) from None
        return value

    gpu_test_clock_file = Unicode(
        help="""
        For tests and demos only: a file holding an ISO instant that
        reservations and preemption take as "now" (plus the seconds since
        the file was written), in the hub and the workbench service alike.
        Empty (the default) uses the real clock. From
        $WORKBENCH_TEST_CLOCK_FILE in the shipped config; see clock.py.
        """,
    ).tag(config=True)

    dcgm_exporter_urls = List(
        Unicode(),
        help="""
        The ``/metrics`` URLs of the dcgm-exporters the site runs on its GPU
        nodes, where idle-GPU reclaim reads a MIG slice's utilization.

        NVML has no utilization for a MIG slice (``nvidia-smi`` shows N/A),
        and a missing reading never counts as idle: without an exporter a
        slice has no idle rule, and the fleet page says so. DCGM's profiling
        field ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` is measured per GPU instance;
        dcgm-exporter labels it with the parent GPU's ``UUID`` and the slice's
        ``GPU_I_ID``, which the inventory knows. The exporter must collect that
        field (dcgm-exporter's ``dcp-metrics-included.csv`` lists it; check the
        counters file yours runs with) and every node with slices needs its
        URL. Whole GPUs keep their reading from NVML (or the user server's
        monitor). An exporter that does not answer within two
        seconds, or lacks a slice's series, leaves that slice without a reading.
        Example::

            c.GPUSpawnerMixin.dcgm_exporter_urls = ["http://gpu-node-1:9400/metrics"]

        $WORKBENCH_DCGM_EXPORTER_URL (comma-separated) in the shipped config.
        """,
    ).tag(config=True)

    @validate("dcgm_exporter_urls")
    def _check_dcgm_exporter_urls(self, proposal: Bunch) -> list[str]:
        from urllib.parse import urlparse

        urls: list[str] = proposal["value"]
        for url in urls:
            parsed = urlparse(url)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise TraitError(
                    f"dcgm_exporter_urls: {url[:80]!r} is not an http(s) URL; write it like "
                    "http://gpu-node-1:9400/metrics"
                )
        return urls
