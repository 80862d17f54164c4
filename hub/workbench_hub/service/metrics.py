"""Prometheus text for the fleet, with the names NVIDIA's dcgm-exporter uses.

Dashboards written for dcgm-exporter (``DCGM_FI_DEV_GPU_UTIL``,
``DCGM_FI_DEV_FB_USED``/``_FREE`` in MiB, ``DCGM_FI_DEV_GPU_TEMP``,
``DCGM_FI_DEV_POWER_USAGE``) work unchanged: the labels are dcgm-exporter's
(``gpu``, ``UUID``, ``modelName``, ``Hostname``: the node the hub stored in
its settings) plus ``user``: who holds the GPU (empty when free). Readings
come from ``workbench_devices`` (NVML, or the simulated source, in which
case every series carries ``simulated="true"``); allocation and quota
numbers come from the workbench database (``workbench_*``). The effective
quota of every hub user is one query (``QuotaBook.effective_many``). One
counter follows the gauges: ``workbench_reconcile_fixes_total{kind}``, what
the hub's reconciler fixed, which it counts in the same database.

The text is written by ``prometheus_client`` (which JupyterHub depends on,
so every hub environment has it), not by hand: a collector yields one
``GaugeMetricFamily`` per metric, registered on a fresh ``CollectorRegistry``
for each scrape and rendered by ``exposition.generate_latest``. The library
owns the format: HELP/TYPE lines, label-value escaping (quotes, backslashes,
newlines in user and model names) and value formatting (Go-style floats:
``3.0``, ``8.589934592e+10``, full precision). A metric with no sample is
not written at all (``generate_latest`` would print its HELP/TYPE lines).
The text is served as the library writes it: ``generate_latest`` sorts a
series' label names, which Prometheus (and every parser) ignores, so the
labels are dcgm-exporter's by name, not by position.

Whether another job holds a GPU outside the workbench is read from any
backend's annotation of the GPU row (a dict-valued entry with the key
``held_outside_workbench``, e.g. Slurm's ``gpu["slurm"]``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from workbench_spawner.ledger.gpu_hours import gpu_hours_by_user
from workbench_spawner.ledger.reconcile_book import ReconcileBook

#: Every metric served: name -> HELP text, in the order they are written. All are gauges.
HELP: dict[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "workbench_gpu_allocated": "Servers holding this GPU (0 = free).",
    "workbench_gpu_memory_total_bytes": "GPU memory in bytes, from the inventory.",
    "workbench_gpus": "GPUs in the inventory.",
    "workbench_gpus_free": "GPUs with a free slot.",
    "workbench_gpu_held_outside": "1 if the engine allocates this GPU to a job outside the workbench "
    "(Slurm; Kubernetes by count per node).",
    "workbench_user_gpus_held": "GPUs a user holds now.",
    "workbench_user_gpu_hours_week": "GPU-hours a user used in the last 7 days.",
    "workbench_user_quota_max_gpus": "The most GPUs a user may hold at once (effective quota).",
}

#: The counters served after the gauges: name (the samples add ``_total``) -> HELP text.
COUNTERS: dict[str, str] = {
    "workbench_reconcile_fixes": "Fixes the hub's reconciler made since the database began, by kind: "
    "lease_closed (its server was gone), server_adopted (a server without a lease, on free GPUs), "
    "server_stopped (a server without a lease, on GPUs leased to another).",
}

GPU_LABELS = ("gpu", "UUID", "modelName", "Hostname", "user")
HOST_LABELS = ("Hostname",)
USER_LABELS = ("user",)

_MIB = 1 << 20


def _held_outside(gpu: Mapping) -> bool | None:
    """Whether a backend says a job outside the workbench holds this GPU (None: no backend says).

    Backends annotate a GPU row with a dict of their own (Slurm: ``gpu["slurm"] =
    {"node_state": ..., "allocated": ..., "held_outside_workbench": ...}``); the first
    such dict with a ``held_outside_workbench`` that is not None answers.
    """
    for value in gpu.values():
        if isinstance(value, Mapping) and value.get("held_outside_workbench") is not None:
            return bool(value["held_outside_workbench"])
    return None


class FleetCollector:
    """A ``prometheus_client`` collector for one scrape of the fleet (read when collected)."""

    def __init__(self, fleet, users: Iterable[Mapping] | None = None):
        self.fleet = fleet
        self.users = None if users is None else list(users)

    def collect(self) -> Iterator[Metric]:
        fleet = self.fleet
        node = fleet.node
        gpu_labels = GPU_LABELS + (("simulated",) if fleet.simulated else ())
        labels_of = {name: USER_LABELS for name in HELP if name.startswith("workbench_user_")}
        labels_of.update(workbench_gpus=HOST_LABELS, workbench_gpus_free=HOST_LABELS)
        families = {
            name: GaugeMetricFamily(name, text, labels=labels_of.get(name, gpu_labels)) for name, text in HELP.items()
        }

        def add(name: str, values: list[str], value) -> None:
            if value is not None:
                families[name].add_metric(values, float(value))

        gpus = fleet.gpus()
        for gpu in gpus:
            holders = ",".join(sorted({h["user"] for h in gpu["holders"]}))
            values = [str(gpu["index"]), gpu["uuid"], gpu["name"], gpu["node"] or node, holders]
            if fleet.simulated:
                values.append("true")
            add("DCGM_FI_DEV_GPU_UTIL", values, gpu["utilization_percent"])
            used, total = gpu["memory_used_bytes"], gpu["memory_total_bytes"]
            if used is not None:
                add("DCGM_FI_DEV_FB_USED", values, used // _MIB)
                add("DCGM_FI_DEV_FB_FREE", values, max(0, total - used) // _MIB)
            add("DCGM_FI_DEV_GPU_TEMP", values, gpu["temperature_c"])
            add("DCGM_FI_DEV_POWER_USAGE", values, gpu["power_w"])
            add("workbench_gpu_allocated", values, len(gpu["holders"]))
            add("workbench_gpu_memory_total_bytes", values, total)
            outside = _held_outside(gpu)
            if outside is not None:
                add("workbench_gpu_held_outside", values, int(outside))
        # One count per node (a cluster has several; one host has one).
        for host in sorted({g["node"] or node for g in gpus} or {node}):
            on_host = [g for g in gpus if (g["node"] or node) == host]
            add("workbench_gpus", [host], len(on_host))
            add("workbench_gpus_free", [host], sum(1 for g in on_host if g["free_slots"] > 0))
        held = fleet.held_by_user()
        hours = gpu_hours_by_user(fleet.store)
        for user in sorted(set(held) | set(hours)):
            add("workbench_user_gpus_held", [user], held.get(user, 0))
            add("workbench_user_gpu_hours_week", [user], round(hours.get(user, 0.0), 4))
        if self.users is None:
            names = set(held) | set(hours) | {q.name for q in fleet.book.all("user")}
            groups_of: dict[str, list[str]] = {name: [] for name in names}
        else:
            groups_of = {u["name"]: list(u.get("groups") or []) for u in self.users}
        effective = fleet.book.effective_many(groups_of, fleet.default)
        for name in sorted(effective):
            add("workbench_user_quota_max_gpus", [name], effective[name].quota.max_gpus)
        # generate_latest writes HELP/TYPE even for a family without samples: leave those out.
        yield from (family for family in families.values() if family.samples)
        # The hub's reconciler counts its fixes in the database (reconcile_book.py): every kind, 0 included.
        fixes = CounterMetricFamily(
            "workbench_reconcile_fixes", COUNTERS["workbench_reconcile_fixes"], labels=("kind",)
        )
        for kind, count in sorted(ReconcileBook(fleet.store).counts().items()):
            fixes.add_metric([kind], float(count))
        yield fixes


def render_metrics(fleet, users: Iterable[Mapping] | None = None) -> str:
    """The metrics text; ``users`` are the hub's user models (name, groups) for the quota series.

    Without them (the hub's API did not answer) the quota series cover the
    users with an own quota or a lease only, as if they had no groups.
    """
    collector = FleetCollector(fleet, users)
    registry = CollectorRegistry(auto_describe=False)  # no describe(): the fleet is read once, when rendered
    registry.register(collector)
    return generate_latest(registry).decode("utf-8")
