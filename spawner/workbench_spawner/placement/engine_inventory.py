"""An engine's GPUs before its jobs name them: simulated devices, placeholders, and the inventory's sentence.

Slurm and Kubernetes count each node's GPUs but never say their UUIDs, which
leases, ``WORKBENCH_GPUS`` and the monitor speak. So an engine's inventory
gives each place on a node (a GRES index, the Nth GPU a device plugin counts)
a device: on simulated nodes the spec's own, whose UUIDs the node's jobs will
report, elsewhere a placeholder in the engine's words (``SLURM-<node>-gpuN``)
until the engine's book (``ledger.node_book.NodeBook``) learns the real UUID
from a report. An engine supplies how it reads its nodes and names a
placeholder; filling the places and saying what was found are shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from workbench_devices import DeviceInventory, GPUDevice


def is_simulated(spec: str) -> bool:
    """Whether ``WORKBENCH_SIMULATED_GPUS`` makes the engine's nodes simulated ("" and "0" do not)."""
    return spec.strip() not in ("", "0")


def node_devices(node: str, simulated: Sequence[GPUDevice], placeholders: Sequence[GPUDevice]) -> list[GPUDevice]:
    """A node's devices, one per place in the order of ``placeholders`` (one for each place the engine
    counts): the simulated spec's take the first places (each that place's index, and the node), the
    placeholders the places the spec does not fill (on a real node, all of them)."""
    return [replace(simulated[i], index=i, node=node) if i < len(simulated) else p for i, p in enumerate(placeholders)]


def summarized(
    engine: str, words: str, simulated: bool, devices: list[GPUDevice], nodes: str, slices_apart: bool = False
) -> DeviceInventory:
    """``devices`` as the inventory of ``engine`` (its source, or "simulated"), with the sentence an admin reads:
    ``4 GPU(s) on Slurm nodes n1 (2), n2 (2)``, where ``words`` names the engine and ``nodes`` lists its nodes.
    ``slices_apart`` counts MIG slices apart (``2 GPU(s) and 3 MIG slice(s)``) for an engine that does not
    count them among its GPUs."""
    label = "simulated GPU(s), readings made up" if simulated else "GPU(s)"
    slices = sum(1 for d in devices if d.mig) if slices_apart else 0
    cut = f" and {slices} MIG slice(s)" if slices else ""
    source = "simulated" if simulated else engine
    return DeviceInventory(source, devices, f"{len(devices) - slices} {label}{cut} on {words} nodes {nodes}")
