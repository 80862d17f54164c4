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

from typing import Any

from workbench_devices import DeviceInventory, GPUDevice, parse_simulated_spec
from workbench_devices.mig import is_profile_name
from workbench_spawner.backends.slurm.node_report import NodeReport
from workbench_spawner.backends.slurm.records import SlurmNode
from workbench_spawner.ledger.node_book import NodeBook
from workbench_spawner.placement.engine import ReportConflictError
from workbench_spawner.placement.engine_inventory import is_simulated, node_devices, summarized

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
    simulated = is_simulated(simulated_spec)
    devices: list[GPUDevice] = []
    for node in nodes:
        known = parse_simulated_spec(simulated_spec, node.name) if simulated else []
        kinds = node.gres_types()
        for index, (kind, device) in enumerate(zip(kinds, known, strict=False)):
            if is_profile_name(kind) != device.mig or (device.mig and device.profile != kind):
                what = f"a {device.profile} slice" if device.mig else f"a whole {device.model}"
                return DeviceInventory(
                    "none",
                    [],
                    f"WORKBENCH_SIMULATED_GPUS lists {what} as GPU {index} of {node.name}, where Slurm has "
                    f"GRES type {kind or '(none)'}; list the simulated devices in gres.conf's order",
                )
        devices += node_devices(node.name, known, [placeholder(node.name, i, kind) for i, kind in enumerate(kinds)])
    return summarized("slurm", "Slurm", simulated, devices, ", ".join(f"{n.name} ({n.gpu_count})" for n in nodes))


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
    engine = "slurm"

    @staticmethod
    def places(known: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
        return {(node, int(e["index"])): e for node, rows in known.items() for e in rows}

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
            where = self.owners(known)
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
