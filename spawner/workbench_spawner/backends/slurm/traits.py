"""The Slurm backend's settings, as traits of one small class (a base of ``SlurmGPUSpawner``).

They map to sbatch (partition, account, QOS, extra options), to where the
single-user environment lives on the nodes, and to who may run jobs.
``backends/slurm/config.py`` sets them from ``WORKBENCH_SLURM_*``;
each also defaults to its environment variable, so a spawner made outside
that config (tests, benchmarks) sees the same values. docs/slurm.md lists
them with the ``slurm.conf`` side.
"""

from __future__ import annotations

import os
import sys

from traitlets import Float, Integer, List, Unicode, default
from traitlets.config import Configurable


class SlurmTraits(Configurable):
    """sbatch options, the shared environment and the accounts jobs may run as."""

    slurm_partition = Unicode(
        help="""
        Partition every job goes to unless the user picks another allowed one
        (``partition`` spawn option). Empty: Slurm's default partition.
        Defaults to $WORKBENCH_SLURM_PARTITION.
        """,
    ).tag(config=True)

    @default("slurm_partition")
    def _default_slurm_partition(self):
        return os.environ.get("WORKBENCH_SLURM_PARTITION", "")

    slurm_partitions = List(
        Unicode(),
        help="""
        Partitions a user may pick with the ``partition`` spawn option, e.g.
        ``["gpu", "debug"]``. Empty (the default): any partition of the
        cluster. A partition that is not in this list, or not in the cluster,
        is refused with a 400 before anything is submitted. Defaults to the
        comma list in $WORKBENCH_SLURM_PARTITIONS.
        """,
    ).tag(config=True)

    @default("slurm_partitions")
    def _default_slurm_partitions(self):
        return [p.strip() for p in os.environ.get("WORKBENCH_SLURM_PARTITIONS", "").split(",") if p.strip()]

    slurm_account = Unicode(
        help="Slurm account (``--account``) of every job. Defaults to $WORKBENCH_SLURM_ACCOUNT.",
    ).tag(config=True)

    @default("slurm_account")
    def _default_slurm_account(self):
        return os.environ.get("WORKBENCH_SLURM_ACCOUNT", "")

    slurm_qos = Unicode(
        help="""
        Slurm QOS (``--qos``) of every job; a site backs our GPU quota with
        the QOS's ``MaxTRESPerUser=gres/gpu=N``. Defaults to $WORKBENCH_SLURM_QOS.
        """,
    ).tag(config=True)

    @default("slurm_qos")
    def _default_slurm_qos(self):
        return os.environ.get("WORKBENCH_SLURM_QOS", "")

    slurm_extra_options = Unicode(
        help="""
        More sbatch options for every job, as one shell-quoted string
        (``--constraint=ib --exclusive``), each put on its own ``#SBATCH``
        line after ours. Defaults to $WORKBENCH_SLURM_EXTRA_OPTIONS.
        """,
    ).tag(config=True)

    @default("slurm_extra_options")
    def _default_slurm_extra_options(self):
        return os.environ.get("WORKBENCH_SLURM_EXTRA_OPTIONS", "")

    slurm_env_prefix = Unicode(
        help="""
        The workbench single-user environment on storage every node mounts
        (a venv or conda env with ``jupyterhub-singleuser``, JupyterLab and
        the GPU monitor). Its ``bin`` goes first on the job's PATH. Defaults
        to $WORKBENCH_SLURM_ENV, else the hub's own environment (right when
        the hub's environment is itself on the shared storage).
        """,
    ).tag(config=True)

    @default("slurm_env_prefix")
    def _default_slurm_env_prefix(self):
        return os.environ.get("WORKBENCH_SLURM_ENV") or sys.prefix

    slurm_poll_interval = Float(
        1.0,
        min=0.1,
        help="Seconds between looks at Slurm's queue while a job is pending or starting.",
    ).tag(config=True)

    slurm_min_uid = Integer(
        1000,
        min=0,
        help="""
        Jobs run as the hub user's own Unix account (``sudo -u <name>
        sbatch``). A spawn for a name with no account on the hub host, or
        whose uid is below this (root, daemon and other system accounts), is
        refused with a 403 before anything is submitted. Lower it only for a
        site whose people have uids below 1000. Defaults to
        $WORKBENCH_SLURM_MIN_UID.
        """,
    ).tag(config=True)

    @default("slurm_min_uid")
    def _default_slurm_min_uid(self):
        value = os.environ.get("WORKBENCH_SLURM_MIN_UID", "").strip()
        return int(value) if value.isdigit() else 1000
