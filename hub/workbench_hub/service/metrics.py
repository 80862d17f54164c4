"""Prometheus text for the fleet, with the names NVIDIA's dcgm-exporter uses.

Dashboards written for dcgm-exporter (``DCGM_FI_DEV_GPU_UTIL``,
``DCGM_FI_DEV_FB_USED``/``_FREE`` in MiB, ``DCGM_FI_DEV_GPU_TEMP``,
``DCGM_FI_DEV_POWER_USAGE``) work unchanged: the labels are dcgm-exporter's
(``gpu``, ``UUID``, ``modelName``, ``Hostname``: the node the hub stored in
its settings) plus ``user``: who holds the GPU (empty when free). Readings
come from ``workbench_devices`` (NVML, or the simulated source, in which
case every series carries ``simulated="true"``); allocation and quota
numbers come from the workbench database (``workbench_*``). The effective
quota of every hub user is one query (``QuotaBook.effective_many``).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from workbench_spawner.rules.quota import gpu_hours_by_user


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def render_metrics(fleet, users: Iterable[Mapping] | None = None) -> str:
    """The metrics text; ``users`` are the hub's user models (name, groups) for the quota series.

    Without them (the hub's API did not answer) the quota series cover the
    users with an own quota or a lease only, as if they had no groups.
    """
    lines: list[str] = []
    series: dict[str, list[str]] = {}
    help_text = {
        "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
        "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
        "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
        "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
        "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
        "workbench_gpu_allocated": ("gauge", "Servers holding this GPU (0 = free)."),
        "workbench_gpu_memory_total_bytes": ("gauge", "GPU memory in bytes, from the inventory."),
        "workbench_gpus": ("gauge", "GPUs in the inventory."),
        "workbench_gpus_free": ("gauge", "GPUs with a free slot."),
        "workbench_gpu_held_outside": ("gauge", "1 if Slurm allocates this GPU to a job outside the workbench."),
        "workbench_user_gpus_held": ("gauge", "GPUs a user holds now."),
        "workbench_user_gpu_hours_week": ("gauge", "GPU-hours a user used in the last 7 days."),
        "workbench_user_quota_max_gpus": ("gauge", "The most GPUs a user may hold at once (effective quota)."),
    }

    def add(name: str, labels: dict[str, str], value) -> None:
        if value is None:
            return
        series.setdefault(name, []).append(f"{name}{_labels(labels)} {float(value):g}")

    gpus = fleet.gpus()
    node = fleet.node
    for gpu in gpus:
        holders = ",".join(sorted({h["user"] for h in gpu["holders"]}))
        labels = {"gpu": str(gpu["index"]), "UUID": gpu["uuid"], "modelName": gpu["name"],
                  "Hostname": gpu["node"] or node, "user": holders}
        if fleet.simulated:
            labels["simulated"] = "true"
        add("DCGM_FI_DEV_GPU_UTIL", labels, gpu["utilization_percent"])
        used, total = gpu["memory_used_bytes"], gpu["memory_total_bytes"]
        if used is not None:
            add("DCGM_FI_DEV_FB_USED", labels, used // (1 << 20))
            add("DCGM_FI_DEV_FB_FREE", labels, max(0, total - used) // (1 << 20))
        add("DCGM_FI_DEV_GPU_TEMP", labels, gpu["temperature_c"])
        add("DCGM_FI_DEV_POWER_USAGE", labels, gpu["power_w"])
        add("workbench_gpu_allocated", labels, len(gpu["holders"]))
        add("workbench_gpu_memory_total_bytes", labels, total)
        if "slurm" in gpu:
            add("workbench_gpu_held_outside", labels, int(gpu["slurm"]["held_outside_workbench"]))
    # One count per node (a cluster has several; one host has one).
    for host in sorted({g["node"] or node for g in gpus} or {node}):
        on_host = [g for g in gpus if (g["node"] or node) == host]
        add("workbench_gpus", {"Hostname": host}, len(on_host))
        add("workbench_gpus_free", {"Hostname": host}, sum(1 for g in on_host if g["free_slots"] > 0))
    held = fleet.held_by_user()
    hours = gpu_hours_by_user(fleet.store)
    for user in sorted(set(held) | set(hours)):
        add("workbench_user_gpus_held", {"user": user}, held.get(user, 0))
        add("workbench_user_gpu_hours_week", {"user": user}, round(hours.get(user, 0.0), 4))
    if users is None:
        names = set(held) | set(hours) | {q.name for q in fleet.book.all("user")}
        groups_of: dict[str, list[str]] = {name: [] for name in names}
    else:
        groups_of = {u["name"]: list(u.get("groups") or []) for u in users}
    effective = fleet.book.effective_many(groups_of, fleet.default)
    for name in sorted(effective):
        add("workbench_user_quota_max_gpus", {"user": name}, effective[name].quota.max_gpus)
    for name, (kind, text) in help_text.items():
        if name in series:
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(series[name])
    return "\n".join(lines) + "\n"
