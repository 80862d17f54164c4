"""``workbench-slurm-singleuser``: the start of a user's server inside its Slurm job.

It does what ``batchspawner-singleuser`` does (pick a free port, POST it to
the hub's ``/hub/api/batchspawner``, run ``jupyterhub-singleuser`` on it) and
one thing more: Slurm never reports GPU UUIDs, so the job reports them. It
reads this node's GPUs (NVML, or the simulated fleet keyed by the node's
name), takes the job's own by Slurm's global indices (``SLURM_JOB_GPUS``,
not ``CUDA_VISIBLE_DEVICES``, which renumbers under cgroup confinement), sets
``WORKBENCH_GPUS`` to their UUIDs for the monitor, and sends the job's GPUs
(by Slurm's index: the place of their device files in gres.conf, ``gres_map``) with the port.
The hub checks those against the indices in Slurm's own job record before
it leases anything.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import asdict, replace
from runpy import run_path
from shutil import which
from typing import Any
from urllib.parse import urlparse, urlunparse

from workbench_devices import DeviceInventory, GPUDevice
from workbench_spawner.backends.slurm.gres_map import devices_by_index, gres_devices, mig_minors

MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"  # the driver's capability minor of each GPU instance


def gpu_minors(uuids: Iterable[str]) -> dict[str, int]:
    """Each NVML GPU's minor number (its ``/dev/nvidiaN``), by UUID; a GPU NVML cannot tell is left out.

    Slurm's GRES index is the place of a device file in gres.conf, not NVML's
    index (under ``ConstrainDevices=yes`` a job sees only its GPUs, numbered
    from 0): the minor number is what ties NVML's GPUs to gres.conf's files."""
    try:
        import pynvml
    except ImportError:  # no NVML here: the GPUs are named by Slurm's numbering alone
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    found = {}
    try:
        for uuid in uuids:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                found[uuid] = int(pynvml.nvmlDeviceGetMinorNumber(handle))
            except pynvml.NVMLError:
                continue
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return found


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def gres_conf_path(env: Mapping[str, str]) -> str:
    """gres.conf is always beside slurm.conf (``SLURM_CONF``, else Debian's /etc/slurm)."""
    return os.path.join(os.path.dirname(env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"), "gres.conf")


def slurm_devices(
    inventory: DeviceInventory,
    node: str = "",
    env: Mapping[str, str] | None = None,
    read: Callable[[str], str] = _read,
    minors_of: Callable[[list[str]], dict[str, int]] = gpu_minors,
) -> list[GPUDevice]:
    """This node's GPUs and MIG slices, each under its Slurm GRES index.

    Simulated nodes list their devices in gres.conf's order (whole GPUs,
    then each GPU's slices, as ``WORKBENCH_SIMULATED_GPUS`` lays them out),
    so a device's Slurm index is its place in that list. NVML devices are
    found by the files gres.conf lists for each index (``gres_map``): a whole
    GPU by its ``/dev/nvidiaN``, a slice by the GPU instance its capability
    file opens (``/proc/driver/nvidia-caps/mig-minors``). Where gres.conf
    lists no files (``AutoDetect=nvml``), whole GPUs go by their minor number
    (the usual ``File=/dev/nvidia[0-7]``) and no slice is reported: a slice
    job there is refused with a sentence rather than leased under a guess
    (docs/slurm.md, "MIG slices on Slurm").
    """
    if inventory.source == "simulated":
        return [replace(d, index=i) for i, d in enumerate(inventory.devices)]
    if inventory.source != "nvml":
        return [d for d in inventory.devices if not d.mig]
    env = os.environ if env is None else env
    uuids = {d.parent_uuid if d.mig else d.uuid for d in inventory.devices} - {""}
    minors = minors_of(sorted(uuids))
    gres = gres_devices(read(gres_conf_path(env)), node)
    if gres is not None:
        # The devices it was given, by Slurm's index.
        by_index = devices_by_index(gres, mig_minors(read(MIG_MINORS)), inventory.devices, minors.get)
        return [replace(d, index=i) for i, d in sorted(by_index.items())]
    return [replace(d, index=minors.get(d.uuid, d.index)) for d in inventory.devices if not d.mig]


def node_report(env: MutableMapping[str, str]) -> dict[str, Any]:
    """This job's node and GPUs, as the hub's ``NodeReport`` reads them.

    Only the job's own GPUs are reported, under Slurm's index: the hub learns
    nothing from a job about GPUs Slurm did not give it."""
    from workbench_devices import discover_devices

    node = env.get("SLURMD_NODENAME") or os.uname().nodename
    spec = env.get("WORKBENCH_SIMULATED_GPUS", "")
    if spec.strip() not in ("", "0"):
        env["WORKBENCH_SIMULATED_NODE"] = node
    inventory = discover_devices(spec or None, node if spec else None)
    wanted = [
        int(i)
        for i in (env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS") or "").split(",")
        if i.strip().isdigit()
    ]
    devices = slurm_devices(inventory, node, env)
    by_index = {d.index: d for d in devices}
    mine = [by_index[i] for i in wanted if i in by_index]
    return {
        "node": node,
        "source": inventory.source,
        "gpus": [asdict(d) for d in mine],
        "job_gpus": [d.uuid for d in mine],
    }


def slice_environment(report: dict) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` naming the job's MIG slices by UUID; {} for a job of whole GPUs.

    For whole GPUs Slurm's own value is right (renumbered under cgroup
    confinement). For a slice in a hand-written gres.conf Slurm sets the
    GRES index, which CUDA would take for a whole GPU: the slice's MIG UUID
    is the only name CUDA reads as that slice, so the server sees exactly it."""
    gpus = report.get("gpus") or []
    if not gpus or not any(g.get("mig") for g in gpus):
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(report["job_gpus"])}


def main(argv: list[str] | None = None) -> None:
    import requests
    from jupyterhub.services.auth import HubAuth
    from jupyterhub.utils import random_port, url_path_join

    argv = list(sys.argv if argv is None else argv)
    report = node_report(os.environ)  # sets WORKBENCH_SIMULATED_NODE for the server it starts
    os.environ["WORKBENCH_GPUS"] = ",".join(report["job_gpus"])
    os.environ.update(slice_environment(report))
    port = random_port()
    auth = HubAuth()
    kwargs: dict[str, Any] = {}
    if auth.certfile and auth.keyfile:
        kwargs["cert"] = (auth.certfile, auth.keyfile)
    if auth.client_ca:
        kwargs["verify"] = auth.client_ca
    reply = requests.post(
        url_path_join(auth.api_url, "batchspawner"),
        headers={"Authorization": f"token {auth.api_token}"},
        json={"port": port, "workbench_report": report},
        timeout=30,
        **kwargs,
    )
    if reply.status_code >= 400:
        sys.exit(
            f"workbench-slurm-singleuser: the hub refused the start report ({reply.status_code}): {reply.text[:300]}"
        )
    service_url = os.environ.get("JUPYTERHUB_SERVICE_URL", "")
    if service_url:
        url = urlparse(service_url)
        os.environ["JUPYTERHUB_SERVICE_URL"] = urlunparse(url._replace(netloc=f"{url.hostname}:{port}"))
    else:
        argv.append(f"--port={port}")
    if len(argv) < 2:
        sys.exit("usage: workbench-slurm-singleuser jupyterhub-singleuser [options]")
    command = which(argv[1])
    if command is None:
        sys.exit(f"workbench-slurm-singleuser: {argv[1]} is not on PATH ({os.environ.get('PATH', '')})")
    sys.argv = argv[1:]
    run_path(command, run_name="__main__")


if __name__ == "__main__":
    main()
