"""``WORKBENCH_BACKEND=slurm``: the hub on a cluster's head or login node.

Kept in the Slurm backend's folder so its settings are one table a site
reads in one place (docs/slurm.md lists them with the slurm.conf side).
Jobs run on other nodes, so the hub's API must listen on an address they
reach (``WORKBENCH_HUB_IP``, default all addresses) and tell them one
(``WORKBENCH_HUB_CONNECT_IP``, default this host's name).
"""

from __future__ import annotations

import shlex
import socket
from pathlib import Path

from traitlets.config import Config

from workbench_hub.env_values import ConfigError, Env, comma_list, number, text
from workbench_spawner.backend import HubContext
from workbench_spawner.image_config import refuse_images


def update_slurm(c: Config, env: Env, bin_dir: Path) -> None:
    c.JupyterHub.spawner_class = "gpu-slurm"
    c.JupyterHub.hub_ip = text(env, "WORKBENCH_HUB_IP", "0.0.0.0")
    c.JupyterHub.hub_connect_ip = text(env, "WORKBENCH_HUB_CONNECT_IP") or socket.gethostname()
    spawner = c.SlurmGPUSpawner
    spawner.slurm_partition = text(env, "WORKBENCH_SLURM_PARTITION")
    spawner.slurm_account = text(env, "WORKBENCH_SLURM_ACCOUNT")
    spawner.slurm_qos = text(env, "WORKBENCH_SLURM_QOS")
    # Partitions a user may pick with the `partition` spawn option (empty: any of the cluster's).
    spawner.slurm_partitions = comma_list(env, "WORKBENCH_SLURM_PARTITIONS")
    # Jobs run as the user's own account: never as root or another system account.
    spawner.slurm_min_uid = number(env, "WORKBENCH_SLURM_MIN_UID", "1000", int)
    extra = text(env, "WORKBENCH_SLURM_EXTRA_OPTIONS")
    try:
        shlex.split(extra)
    except ValueError as exc:
        raise ConfigError(f"WORKBENCH_SLURM_EXTRA_OPTIONS cannot be read as sbatch options ({exc})") from None
    spawner.slurm_extra_options = extra
    # The single-user environment on storage every node mounts; the hub's own by default.
    env_prefix = text(env, "WORKBENCH_SLURM_ENV") or str(bin_dir.parent)
    spawner.slurm_env_prefix = env_prefix
    c.Spawner.cmd = [str(Path(env_prefix) / "bin" / "jupyterhub-singleuser")]
    # How soon a job that ended (scancel, time limit, node failure) gives its GPUs back.
    c.Spawner.poll_interval = number(env, "WORKBENCH_SLURM_POLL_SECONDS", "30", int)
    c.Spawner.http_timeout = number(env, "WORKBENCH_SLURM_HTTP_TIMEOUT", "120", int)


def configure(c: Config, env: Env, hub: HubContext) -> None:
    """``WORKBENCH_BACKEND=slurm``."""
    refuse_images(env, "slurm", "the cluster's Python environment (the batch job's)")
    update_slurm(c, env, hub.bin_dir)
