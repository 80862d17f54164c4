"""What we say to sbatch: a server's request as ``#SBATCH`` options, and sbatch's refusals as ours.

Pure functions with table tests (tests/unit/test_slurm_rules.py): memory in
whole MiB, the session limit as ``--time``, the GPU request as a GRES
(``gpu:<type>:N`` where the model, or a MIG slice's profile, is the GRES type), the job's tag in its
comment; and a failed sbatch as an HTTP status and a sentence for the user
(503 when the controller did not answer, 400 when it refused the request).
"""

from __future__ import annotations

import math
import re
import shlex
from collections import Counter

from workbench_spawner.backends.slurm.tags import job_tag


def memory_megabytes(limit: int | float | None) -> int | None:
    """Bytes (the spawner's mem_limit) -> whole MiB for ``--mem``; None for no limit."""
    if not limit:
        return None
    return max(1, math.ceil(float(limit) / (1024 * 1024)))


def time_limit(hours: float | None) -> str | None:
    """``max_session_hours`` -> ``--time`` as D-HH:MM:SS (whole minutes, at least 1)."""
    if hours is None or hours <= 0:
        return None
    minutes = max(1, math.ceil(hours * 60))
    days, minutes = divmod(minutes, 24 * 60)
    return f"{days}-{minutes // 60:02d}:{minutes % 60:02d}:00"


def gres_for(gpus: int, model: str | None, profile: str | None = None, whole_type: str | None = None) -> str | None:
    """The GPU request as a GRES: ``gpu:<profile>:N`` for MIG slices, ``gpu:<type>:N`` for whole GPUs.

    A slice's GRES type is its MIG profile (``gpu:1g.18gb:1``); a whole GPU's
    is the model key lower-cased (``gpu:h100-80gb:2``). A request for any
    whole GPU is a bare ``gpu:N``, except on a cluster that also has slices:
    Slurm would hand out a slice for it, so it names ``whole_type`` (the
    type of the cluster's whole GPUs, ``whole_gpu_type``)."""
    if gpus <= 0:
        return None
    kind = profile or (model.lower() if model else whole_type)
    return f"gpu:{kind}:{gpus}" if kind else f"gpu:{gpus}"


def whole_gpu_type(inventory) -> str | None:
    """The GRES type a whole-GPU request with no model names: None where the cluster has no slices.

    Where it has, the model with the most whole GPUs (a site with several
    whole models and slices lets its users or quotas name the model)."""
    devices = inventory.devices
    if not any(d.mig for d in devices):
        return None
    counts = Counter(d.model.lower() for d in devices if not d.mig and d.model)
    return max(counts, key=lambda m: (counts[m], m)) if counts else None


def sbatch_options(
    *,
    user: str,
    server: str,
    gpus: int,
    model: str | None = None,
    profile: str | None = None,
    whole_type: str | None = None,
    cpus: float | None = None,
    mem_bytes: int | float | None = None,
    session_hours: float | None = None,
    partition: str = "",
    account: str = "",
    qos: str = "",
    extra: str = "",
    hub: str = "",
) -> list[str]:
    """Every sbatch option of one server's job, in order (each goes on an ``#SBATCH`` line).

    ``--no-requeue``: Slurm requeues a batch job whose node failed (``JobRequeue=1``
    is its default), which would bring the server back on another node with a
    new port while the hub still holds the old lease; a failed node ends the
    server instead, and the user starts a new one.
    """
    opts = [
        f"--job-name=wb-{re.sub(r'[^A-Za-z0-9_.-]', '_', user)[:40]}",
        f"--comment={job_tag(user, server, hub)}",
        "--no-requeue",
    ]
    gres = gres_for(gpus, model, profile, whole_type)
    if gres:
        opts.append(f"--gres={gres}")
    if cpus:
        opts.append(f"--cpus-per-task={max(1, math.ceil(cpus))}")
    mem = memory_megabytes(mem_bytes)
    if mem:
        opts.append(f"--mem={mem}M")
    limit = time_limit(session_hours)
    if limit:
        opts.append(f"--time={limit}")
    for flag, value in (("--partition", partition), ("--account", account), ("--qos", qos)):
        if value:
            opts.append(f"{flag}={value}")
    opts.extend(shlex.split(extra or ""))
    return opts


# What sbatch says when the controller, not the request, is the problem.
UNREACHABLE = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Zero Bytes were transmitted",
    "Connection refused",
    "Communication connection failure",
)


def sbatch_failure(message: str) -> tuple[int, str]:
    """(HTTP status, sentence) for a failed sbatch: 503 when Slurm did not answer, else 400."""
    text = " ".join((message or "").split())[:300] or "no message"
    if any(words.lower() in text.lower() for words in UNREACHABLE):
        return 503, (
            f"Slurm's controller did not answer, so no job was submitted ({text}). Try again in a "
            "minute; if it persists, tell a hub admin."
        )
    return 400, f"Slurm refused the job: {text.rstrip('.')}."
