"""The cluster's GPUs as the workbench knows them: Slurm's node records plus the UUIDs jobs reported.

Slurm counts GPUs per node by GRES index and never reports UUIDs; leases,
``WORKBENCH_GPUS`` and the monitor speak UUIDs. So the inventory starts from
``sinfo`` (one device per node and index) and learns each real GPU's UUID,
name and memory from the first job on that node that reports them
(``backends.slurm.singleuser``), after the hub checked the report against Slurm's own
job record. What it learned is kept in the GPU database (``NodeGPUMap``), so
the hub after a restart, the workbench service's fleet view and reconcile all
resolve ``(node, index)`` to the same UUID.

Trust: the report comes from a process the user controls. It is learned
only after it agreed with Slurm's job record, and only for the GPUs Slurm
gave that job on that node; each (node, index) is named once, and a later
report that contradicts it, or puts a known UUID elsewhere, is refused (and
the job cancelled), so one user cannot rename GPUs for everyone. What a job
can still do is misname its own GPU on first use; the admin page then shows
that UUID, and ``forget`` clears it.
Simulated nodes need no report: the hub computes their UUIDs itself.
An admin who swaps a node's GPUs clears that node's entry
(``NodeGPUMap.forget``, or ``workbench slurm-forget-node <node>``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from workbench_devices import DeviceInventory, GPUDevice, parse_simulated_spec
from workbench_devices.mig import is_profile_name
from workbench_spawner.backends.slurm.node_report import NodeReport
from workbench_spawner.backends.slurm.records import SlurmNode
from workbench_spawner.ledger.node_book import NodeBook
from workbench_spawner.placement.engine import ReportConflictError

NODE_GPUS_KEY = "slurm-node-gpus"


def placeholder_uuid(node: str, index: int) -> str:
    """The name of a real GPU no job on its node has reported yet."""
    return f"SLURM-{node}-gpu{index}"


def cluster_inventory(nodes: list[SlurmNode], simulated_spec: str) -> DeviceInventory:
    """Every GPU of the cluster from Slurm's node records, one device per (node, GRES index).

    A GRES whose type is a MIG profile (``gpu:1g.18gb``, a site's gres.conf
    lists slices so) is a slice: asked for by that profile, charged by its
    share of a GPU. Simulated GPUs take the UUIDs each node's jobs will report
    (``GPU-sim-<node>-NN-...``, ``MIG-sim-<node>-...``): the spec lists the
    devices in Slurm's index order, and a node takes as many as it has GRES.
    Real GPUs are named ``SLURM-<node>-gpuN`` until ``NodeGPUMap.resolve`` puts
    the reported UUID in their place. A simulated device whose kind is not
    the GRES type Slurm has at its index (a slice where Slurm has a whole GPU)
    would put the wrong UUID in leases: such a spec gives no inventory and
    says why.
    """
    simulated = simulated_spec.strip() not in ("", "0")
    devices: list[GPUDevice] = []
    for node in nodes:
        known = parse_simulated_spec(simulated_spec, node.name) if simulated else []
        for index, kind in enumerate(node.gres_types()):
            if index < len(known):
                device = known[index]
                if is_profile_name(kind) != device.mig or (device.mig and device.profile != kind):
                    what = f"a {device.profile} slice" if device.mig else f"a whole {device.model}"
                    return DeviceInventory(
                        "none",
                        [],
                        f"WORKBENCH_SIMULATED_GPUS lists {what} as GPU {index} of {node.name}, where Slurm has "
                        f"GRES type {kind or '(none)'}; list the simulated devices in gres.conf's order",
                    )
                devices.append(replace(device, index=index, node=node.name))
            else:
                devices.append(placeholder(node.name, index, kind))
    source = "simulated" if simulated else "slurm"
    names = ", ".join(f"{n.name} ({n.gpu_count})" for n in nodes)
    label = "simulated GPU(s), readings made up" if simulated else "GPU(s)"
    return DeviceInventory(source, devices, f"{len(devices)} {label} on Slurm nodes {names}")


def placeholder(node: str, index: int, kind: str) -> GPUDevice:
    """A real GPU (or slice, where the GRES type is a MIG profile) no job on its node has reported yet."""
    slice_ = is_profile_name(kind)
    return GPUDevice(
        uuid=placeholder_uuid(node, index),
        index=index,
        name=f"{kind or 'GPU'} {'slice ' if slice_ else ''}on {node}",
        memory_total_bytes=0,
        model="" if slice_ else (kind or "").upper(),
        node=node,
        mig=slice_,
        profile=kind if slice_ else "",
    )


def resolve(inventory: DeviceInventory, known: Mapping[str, Iterable[dict]]) -> DeviceInventory:
    """The inventory with every reported GPU under its real UUID, name and memory."""
    if inventory.source != "slurm" or not known:
        return inventory
    by_place = {(node, int(e["index"])): e for node, rows in known.items() for e in rows}
    devices = []
    for device in inventory.devices:
        entry = by_place.get((device.node, device.index))
        if entry is None:
            devices.append(device)
            continue
        learned = replace(
            device,
            uuid=entry["uuid"],
            name=entry.get("name") or device.name,
            memory_total_bytes=int(entry.get("memory_total_bytes") or 0),
        )
        if device.mig and entry.get("profile") == device.profile:  # the slice's GPU, as the job saw it
            learned = replace(learned, parent_uuid=entry.get("parent_uuid", ""), model=entry.get("model", ""))
        devices.append(learned)
    return replace(inventory, devices=devices)


class MapConflictError(ReportConflictError):
    """A node report that contradicts what the hub knows; str(err) is for the admin."""


def _entries(report: NodeReport) -> list[dict]:
    """The reported GPUs as kept per node; a slice keeps its profile, its GPU and that GPU's model."""
    entries = []
    for g in report.gpus:
        entry = {
            "index": int(g.get("index", -1)),
            "uuid": str(g["uuid"]),
            "name": str(g.get("name", "")),
            "memory_total_bytes": int(g.get("memory_total_bytes") or 0),
        }
        if g.get("mig") and g.get("profile"):
            entry.update(profile=str(g["profile"]), parent_uuid=str(g.get("parent_uuid") or ""))
            entry["model"] = str(g.get("model") or "")
        entries.append(entry)
    return sorted(entries, key=lambda e: e["index"])


class NodeGPUMap(NodeBook):
    """Per node, index -> the GPU a job reported there (``NodeBook``)."""

    key = NODE_GPUS_KEY

    def accept(self, report: NodeReport) -> None:
        """Learn the GPUs a job reported on its node; MapConflictError if they contradict what is known.

        Called only for a report that agrees with Slurm's own job record (the
        job's node, the indices Slurm gave it), so a job can name only the GPUs
        it was given, on the node it runs on. Each (node, index) is named once:
        a later report must give it the same UUID, and a UUID belongs to one
        place in the cluster."""
        entries = _entries(report)
        if not entries:
            return

        def learn(known: dict[str, Any]) -> bool:
            here = {e["index"]: e for e in known.get(report.node, [])}
            where = {e["uuid"]: (node, e["index"]) for node, rows in known.items() for e in rows}
            new = []
            for entry in entries:
                old = here.get(entry["index"])
                if old is not None and old["uuid"] != entry["uuid"]:
                    raise MapConflictError(
                        f"node {report.node} reported GPU {entry['index']} as {entry['uuid']}, but the hub knows it "
                        f"as {old['uuid']}; if the node's GPUs were changed, an admin runs "
                        f"`workbench slurm-forget-node {report.node}`"
                    )
                place = where.get(entry["uuid"])
                if place is not None and place != (report.node, entry["index"]):
                    raise MapConflictError(
                        f"node {report.node} reported GPU {entry['index']} as {entry['uuid']}, which the "
                        f"hub knows as GPU {place[1]} of node {place[0]}"
                    )
                if old is None:
                    new.append(entry)
            if not new:
                return False
            known[report.node] = sorted([*here.values(), *new], key=lambda e: e["index"])
            return True

        self.update(learn)

    resolve_with = staticmethod(resolve)
