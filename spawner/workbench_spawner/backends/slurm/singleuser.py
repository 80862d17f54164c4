"""``workbench-slurm-singleuser``: the start of a user's server inside its Slurm job.

It does what ``batchspawner-singleuser`` does (pick a free port, POST it to
the hub's ``/hub/api/batchspawner``, run ``jupyterhub-singleuser`` on it) and
one thing more: Slurm never reports GPU UUIDs, so the job reports them. It
reads this node's GPUs (NVML, or the simulated fleet keyed by the node's
name), takes the job's own by Slurm's global indices (``SLURM_JOB_GPUS``,
not ``CUDA_VISIBLE_DEVICES``, which renumbers under cgroup confinement), sets
``WORKBENCH_GPUS`` to their UUIDs for the monitor, and sends the job's GPUs
(by Slurm's index, the minor number of ``/dev/nvidiaN``) with the port.
The hub checks those against the indices in Slurm's own job record before
it leases anything.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, replace
from runpy import run_path
from shutil import which
from urllib.parse import urlparse, urlunparse


def slurm_indices(devices) -> dict[str, int]:
    """Each NVML GPU's index as Slurm counts it: the minor number of its ``/dev/nvidiaN``.

    Slurm's GRES index is the position of the device file in gres.conf's
    ``File=`` list, which with the usual ``File=/dev/nvidia[0-7]`` is the
    minor number. NVML's own index is not: under ``ConstrainDevices=yes`` a
    job sees only its GPUs, numbered from 0. A GPU whose minor number NVML
    cannot tell keeps NVML's index."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}
    found = {}
    try:
        for device in devices:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(device.uuid)
                found[device.uuid] = int(pynvml.nvmlDeviceGetMinorNumber(handle))
            except Exception:
                continue
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return found


def slurm_devices(inventory) -> list:
    """This node's GPUs and MIG slices, each under its Slurm GRES index.

    Simulated nodes list their devices in gres.conf's order (whole GPUs,
    then each GPU's slices, as ``WORKBENCH_SIMULATED_GPUS`` lays them out),
    so a device's Slurm index is its place in that list: a slice's MIG UUID
    is what the job reports for the index of its ``gpu:<profile>`` GRES.
    NVML GPUs go by the minor number of ``/dev/nvidiaN`` (``slurm_indices``),
    others by their own index; an NVML slice is not reported, because its GRES index depends on the
    order of the capability files in the site's gres.conf, which the job
    cannot see: a slice job on such a node is refused with a sentence
    (docs/slurm.md, "MIG slices on Slurm").
    """
    if inventory.source == "simulated":
        return [replace(d, index=i) for i, d in enumerate(inventory.devices)]
    minors = slurm_indices(inventory.devices) if inventory.source == "nvml" else {}
    return [replace(d, index=minors.get(d.uuid, d.index)) for d in inventory.devices if not d.mig]


def node_report(env: dict[str, str]) -> dict:
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
    devices = slurm_devices(inventory)
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
    kwargs = {}
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
