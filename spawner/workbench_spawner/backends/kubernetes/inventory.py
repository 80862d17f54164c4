"""The cluster's GPUs as the workbench knows them: the nodes' device-plugin counts plus the UUIDs pods reported.

A node's ``nvidia.com/gpu`` capacity says how many GPUs it has, and GPU
Feature Discovery's labels (``nvidia.com/gpu.product``, ``nvidia.com/gpu.memory``)
what they are; nothing in the API names them. Leases, ``WORKBENCH_GPUS`` and
the monitor speak UUIDs, so the inventory starts with one device per node
and GPU (``K8S-<node>-gpuN``) and learns each real GPU's UUID from the first
pod on that node that reports it (the NVIDIA device plugin's default ID
strategy puts UUIDs in ``NVIDIA_VISIBLE_DEVICES``). What it learned is kept
in the GPU database (``NodeUUIDs``), so the hub after a restart, the
workbench service's fleet view and reconcile resolve the same names.

Trust: the report comes from a process the user controls. It is learned only
after it agreed with the pod as Kubernetes describes it (the node it was
scheduled on, the number of GPUs it asked for), a UUID belongs to one node,
and a node never has more UUIDs than GPUs. A pod can still misname its own
GPU on first use; ``forget`` clears a node's names (docs/kubernetes.md).

Simulated nodes need no report: the hub computes their UUIDs itself
(``GPU-sim-<node>-NN-...``, what the stand-in device plugin advertises).

MIG slices: in the device plugin's "mixed" strategy a node advertises each
profile as a resource of its own (``nvidia.com/mig-1g.18gb: 7``). Each slice
is a device (``mig``, its ``profile``, the node's GPU model), named
``K8S-<node>-mig-<profile>-N`` until a pod on it reports its MIG UUID, which is
learned per node and profile (``slice_key``) by the same rules; a simulated
node's slices are the spec's own (``MIG-sim-<node>-...``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from workbench_devices import DeviceInventory, GPUDevice, parse_simulated_spec
from workbench_spawner.backends.kubernetes.cluster import KubeNode
from workbench_spawner.ledger.node_book import NodeBook
from workbench_spawner.placement.engine import ReportConflictError
from workbench_spawner.placement.engine_inventory import is_simulated, node_devices, summarized

NODE_UUIDS_KEY = "kubernetes-node-gpus"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"
VENDOR_WORDS = {"NVIDIA", "TESLA", "GEFORCE", "RTX"}


def placeholder_uuid(node: str, index: int) -> str:
    """The name of a real GPU no pod on its node has reported yet."""
    return f"K8S-{node}-gpu{index}"


def slice_placeholder(node: str, profile: str, place: int) -> str:
    """The name of a real MIG slice of ``profile`` no pod on its node has reported yet."""
    return f"K8S-{node}-mig-{profile}-{place}"


def slice_key(node: str, profile: str) -> str:
    """Where ``NodeUUIDs`` keeps the MIG UUIDs reported for ``profile`` on ``node`` (a node name has no "/")."""
    return f"{node}/mig-{profile}"


def is_placeholder(uuid: str) -> bool:
    return uuid.startswith("K8S-")


def model_of(labels: Mapping[str, str], product_label: str = GFD_PRODUCT, memory_label: str = GFD_MEMORY) -> str:
    """The workbench's model name (``H200-141GB``) from GPU Feature Discovery's labels; "" if unlabelled.

    GFD's product is NVML's name with spaces as dashes (``NVIDIA-H200``);
    its memory label is in MiB. The model drops the vendor and adds whole
    GiB, as the simulated and NVML inventories name models."""
    product = (labels.get(product_label) or "").strip()
    if not product:
        return ""
    # The board's name without vendor words, as the NVML inventory names models: NVIDIA-H100-80GB-HBM3
    # (80 GiB) is H100-80GB, NVIDIA-A100-SXM4-40GB is A100-40GB, NVIDIA-H200 (141 GiB) is H200-141GB.
    words = [w for w in re.split(r"[\s-]+", product) if w.upper() not in VENDOR_WORDS]
    short = (words[0] if words else product).upper()
    mib = _mib(labels.get(memory_label))
    return f"{short}-{round(mib / 1024)}GB" if mib else short


def cluster_inventory(
    nodes: Sequence[KubeNode],
    simulated_spec: str,
    product_label: str = GFD_PRODUCT,
    memory_label: str = GFD_MEMORY,
) -> DeviceInventory:
    """One device per GPU the nodes' device plugins advertise (capacity, so a drained GPU still shows)."""
    simulated = is_simulated(simulated_spec)
    with_gpus = [n for n in nodes if n.gpu_capacity or n.slices]
    devices: list[GPUDevice] = []
    for node in with_gpus:
        spec = parse_simulated_spec(simulated_spec, node.name) if simulated else []
        model = model_of(node.labels, product_label, memory_label)
        product = (node.labels.get(product_label) or "GPU").replace("-", " ")
        devices.extend(_slices(node, [d for d in spec if d.mig], model, product))
        memory = _mib(node.labels.get(memory_label)) * 1024 * 1024
        placeholders = [
            GPUDevice(
                uuid=placeholder_uuid(node.name, index),
                index=index,
                name=f"{product} on {node.name}",
                memory_total_bytes=memory,
                model=model,
                node=node.name,
            )
            for index in range(node.gpu_capacity)
        ]
        devices.extend(node_devices(node.name, [d for d in spec if not d.mig], placeholders))
    # Whole GPUs first, by node, then the slices: the order the form and the fleet list them in.
    devices.sort(key=lambda d: d.mig)
    names = ", ".join(f"{n.name} ({_counted(n)})" for n in with_gpus) or "none"
    return summarized("kubernetes", "Kubernetes", simulated, devices, names, slices_apart=True)


def _counted(node: KubeNode) -> str:
    slices = ", ".join(f"{c.capacity}x{p}" for p, c in node.slices.items())
    return f"{node.gpu_capacity}, {slices}" if slices else str(node.gpu_capacity)


def _slices(node: KubeNode, simulated: Sequence[GPUDevice], model: str, product: str) -> list[GPUDevice]:
    """One device per MIG slice the node advertises: the spec's on a simulated node (each keeps its GPU's
    index, as NVML numbers a slice), else placeholders numbered by their place among the profile's slices."""
    devices = []
    for profile, count in node.slices.items():
        spec = [d for d in simulated if d.profile == profile]
        for place in range(count.capacity):
            if place < len(spec):
                devices.append(replace(spec[place], node=node.name))
                continue
            devices.append(
                GPUDevice(
                    uuid=slice_placeholder(node.name, profile, place),
                    index=place,
                    name=f"{product} MIG {profile} on {node.name}",
                    memory_total_bytes=_profile_bytes(profile),
                    model=model,
                    mig=True,
                    node=node.name,
                    profile=profile,
                )
            )
    return devices


def _profile_bytes(profile: str) -> int:
    """A profile's memory as its name says it (``1g.18gb``: 18 GB), as the simulated slices count it."""
    digits = profile.partition(".")[2].lower().removesuffix("gb")
    return int(digits) * 10**9 if digits.isdigit() else 0


def _mib(label: str | None) -> int:
    """GFD's memory label (MiB); 0 where it is missing or unreadable."""
    try:
        return int(label or 0)
    except ValueError:
        return 0


class UUIDConflictError(ReportConflictError):
    """A report that contradicts what the hub knows; str(err) is for the admin."""


class NodeUUIDs(NodeBook):
    """Per node, the UUIDs pods reported there (``NodeBook``; MIG slices under ``slice_key``)."""

    key = NODE_UUIDS_KEY
    engine = "kubernetes"

    @staticmethod
    def places(known: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
        """A key's UUIDs take its places in the order pods reported them."""
        return {(key, i): {"uuid": uuid} for key, uuids in known.items() for i, uuid in enumerate(uuids)}

    @staticmethod
    def place_key(device: GPUDevice) -> str:
        """A slice's UUIDs are kept per node and profile (``slice_key``), a whole GPU's per node."""
        return slice_key(device.node, device.profile) if device.mig else device.node

    def accept(self, node: str, uuids: Iterable[str], capacity: int, profile: str = "") -> None:
        """Learn ``uuids`` on ``node`` (slices of ``profile`` if given); UUIDConflictError if one is known
        elsewhere or the node would exceed ``capacity`` (of that profile)."""
        uuids = list(uuids)
        where = node
        node = slice_key(node, profile) if profile else node

        def learn(known: dict[str, Any]) -> bool:
            owners = self.owners(known)
            for uuid in uuids:
                if uuid in owners and owners[uuid][0] != node:
                    elsewhere = owners[uuid][0]
                    other = elsewhere.partition("/")[0]
                    raise UUIDConflictError(
                        f"a pod on {where} reported GPU {uuid}, which the hub knows on node {elsewhere}; if GPUs "
                        f"moved, an admin runs `workbench kubernetes-forget-node {other}`"
                    )
            here = list(known.get(node, []))
            new = [u for u in uuids if u not in here]
            if not new:
                return False
            if len(here) + len(new) > capacity:
                what = f"{profile} MIG slices" if profile else "GPUs"
                raise UUIDConflictError(
                    f"pods on {where} reported {len(here) + len(new)} different {what}, but the node has {capacity}; "
                    f"if its GPUs were replaced, an admin runs `workbench kubernetes-forget-node {where}`"
                )
            known[node] = here + new
            return True

        self.update(learn)
