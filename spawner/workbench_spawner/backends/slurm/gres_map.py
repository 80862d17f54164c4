"""Which GPU or MIG slice a Slurm GRES index is on a real node, from gres.conf and the driver's MIG minors.

Slurm never names a GPU by UUID: a job learns its GPUs as GRES indices
(``SLURM_JOB_GPUS``), and an index is the place of a device in the node's
gres.conf, each ``Name=gpu`` line in turn with its ``File=`` range expanded.
A MIG slice is one line of its own whose ``MultipleFiles=`` names its GPU's
``/dev/nvidiaN`` and the capability files of its GPU and compute instance
(``/dev/nvidia-caps/nvidia-capK``), as Slurm's gres.conf manual lays MIG out::

    NodeName=gpu01 Name=gpu Type=h100-80gb File=/dev/nvidia[0-1]
    NodeName=gpu01 Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia2,/dev/nvidia-caps/nvidia-cap21,...

The driver says which instance a capability file opens
(``/proc/driver/nvidia-caps/mig-minors``: ``gpu2/gi1/access 21``), and NVML
says each GPU's minor number and each slice's GPU and GPU instance id. So an
index leads to its files, the files to (GPU minor, GPU instance), and those
to the slice's ``MIG-`` UUID: ``devices_by_index``. A node whose gres.conf
lists no files (``AutoDetect=nvml``) gives no map, and the job's start-up
falls back to minor numbers for whole GPUs and reports no slice (the hub
then refuses the slice job in words rather than lease a guessed UUID).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from workbench_devices import GPUDevice
from workbench_spawner.backends.slurm.records import expand_ranges

CAP_FILE = re.compile(r"^/dev/nvidia-caps/nvidia-cap(\d+)$")
GPU_FILE = re.compile(r"^/dev/nvidia(\d+)$")
MIG_MINOR = re.compile(r"^gpu(\d+)/gi(\d+)/(?:ci\d+/)?access\s+(\d+)$")  # a GPU or compute instance
BRACKETS = re.compile(r"^(?P<head>[^\[]*)\[(?P<body>[^\]]+)\](?P<tail>.*)$")
OUTSIDE_BRACKETS = re.compile(r",(?![^\[]*\])")  # a comma not inside [...]


@dataclass(frozen=True)
class GresDevice:
    """One GRES index of the node: its type (``h100-80gb``, ``1g.10gb``) and the device files it opens."""

    type: str
    files: tuple[str, ...]


def expand(pattern: str) -> list[str]:
    """A Slurm range: ``/dev/nvidia[0-3]`` -> four names, ``gpu[01-02,07]`` -> ``gpu01 gpu02 gpu07``."""
    found = BRACKETS.match(pattern)
    if not found:
        return [pattern]
    head, tail = found["head"], found["tail"]
    return [name for item in expand_ranges(found["body"]) for name in expand(f"{head}{item}{tail}")]


def _names(value: str) -> list[str]:
    """A comma list whose items may hold ranges (a comma inside brackets belongs to the range)."""
    return [name for item in OUTSIDE_BRACKETS.split(value) if item for name in expand(item)]


def gres_devices(text: str, node: str) -> list[GresDevice] | None:
    """The node's GPU GRES indices in Slurm's order, or None where gres.conf does not list their files.

    Lines for other nodes (``NodeName=``) and other GRES (``Name=shard``...) are skipped; a ``File=``
    range is one index per file; ``MultipleFiles=`` is one index for all its files (a MIG slice)."""
    devices: list[GresDevice] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = {key.lower(): value for key, _, value in (word.partition("=") for word in shlex.split(line))}
        if "nodename" in fields and node not in _names(fields["nodename"]):
            continue
        if fields.get("name", "").lower() != "gpu":
            continue
        kind = fields.get("type", "")
        if "multiplefiles" in fields:
            devices.append(GresDevice(kind, tuple(_names(fields["multiplefiles"]))))
        elif "file" in fields:
            devices.extend(GresDevice(kind, (name,)) for name in _names(fields["file"]))
        else:
            return None  # counted, not listed (AutoDetect=nvml, or Count= alone): no order to read
    return devices or None


def mig_minors(text: str) -> dict[int, tuple[int, int]]:
    """``/proc/driver/nvidia-caps/mig-minors``: capability minor -> (GPU minor, GPU instance id), for the access
    files of GPU instances and of their compute instances (a site's gres.conf may list either)."""
    found = {}
    for line in text.splitlines():
        match = MIG_MINOR.match(line.strip())
        if match:
            gpu, instance, minor = (int(g) for g in match.groups())
            found[minor] = (gpu, instance)
    return found


def devices_by_index(
    gres: Sequence[GresDevice],
    minors: dict[int, tuple[int, int]],
    devices: Iterable[GPUDevice],
    minor_of: Callable[[str], int | None],
) -> dict[int, GPUDevice]:
    """Slurm's index -> this node's ``GPUDevice`` (a whole GPU by its ``/dev/nvidiaN``, a slice by the GPU
    instance its capability file opens). An index whose device cannot be told is left out: the job then
    reports fewer GPUs than Slurm gave it, and the hub refuses to lease a guess."""
    devices = list(devices)
    whole = {minor_of(d.uuid): d for d in devices if not d.mig}
    slices: dict[tuple[int, int], GPUDevice] = {}
    for d in devices:
        parent = minor_of(d.parent_uuid) if d.mig and d.parent_uuid else None
        if parent is not None and d.gpu_instance_id is not None:
            slices[(parent, int(d.gpu_instance_id))] = d
    found: dict[int, GPUDevice] = {}
    for index, entry in enumerate(gres):
        caps = [int(m[1]) for f in entry.files if (m := CAP_FILE.match(f))]
        if caps:
            instance = next((minors[c] for c in caps if c in minors), None)
            if instance is not None and instance in slices:
                found[index] = slices[instance]
            continue
        gpus = [int(m[1]) for f in entry.files if (m := GPU_FILE.match(f))]
        if len(gpus) == 1 and gpus[0] in whole:
            found[index] = whole[gpus[0]]
    return found
