"""``POST /hub/api/batchspawner``: a Slurm job's start report, and nothing more.

batchspawner 1.3.0 registers a handler at this address that sets *any*
attribute of the spawner that a job posts (``setattr`` for every key). The
job runs as the user and holds the server's API token, so a user could post
``{"exec_prefix": "", "batch_cancel_cmd": "..."}`` and have the hub run that
command, as the hub's own account (root on a Slurm head node), at the next
stop. This module puts a handler in its place that takes exactly what a
start needs: ``port`` (the server's port on the node) and
``workbench_report`` (the node's GPUs and the job's, see
``backends.slurm.singleuser``), each checked, and only while that spawner is
starting. Anything else is a 400 with a sentence and changes nothing.
"""

from __future__ import annotations

from typing import Any

from jupyterhub import apihandlers
from traitlets.config import Config

from workbench_spawner.backends.slurm.node_report import NodeReport
from workbench_spawner.placement.engine_extension import add_hub_route
from workbench_spawner.placement.engine_report import (
    MAX_GPUS,
    MAX_TEXT,
    ReportRefusedError,
    report_fields,
    start_report_handler,
)

__all__ = ["ROUTE", "StartReportHandler", "install", "read_report"]

ROUTE = r"/api/batchspawner"


def read_report(body: Any) -> dict[str, Any]:
    """The accepted fields of a start report, or ReportRefusedError with the reason."""
    accepted = dict(report_fields(body, ("port", "workbench_report")))
    if not accepted:
        raise ReportRefusedError("the start report carries neither port nor workbench_report")
    if "port" in accepted and not (_whole(port := accepted["port"]) and 1 <= port <= 65535):
        raise ReportRefusedError(f"port must be a whole number from 1 to 65535, not {str(port)[:20]!r}")
    if "workbench_report" in accepted:
        report = accepted["workbench_report"]
        if NodeReport.from_json(report) is None:
            raise ReportRefusedError("workbench_report must be an object naming the node, its GPUs and the job's")
        gpus, job_gpus = report.get("gpus") or [], report.get("job_gpus") or []
        if len(gpus) > MAX_GPUS or len(job_gpus) > MAX_GPUS:
            raise ReportRefusedError(f"workbench_report lists more than {MAX_GPUS} GPUs")
        if not _short_texts(report):
            raise ReportRefusedError(f"workbench_report has a text longer than {MAX_TEXT} characters")
        for gpu in gpus:
            if not (
                isinstance(gpu, dict)
                and isinstance(gpu.get("uuid"), str)
                and _whole(gpu.get("index"))
                and _whole(gpu.get("memory_total_bytes", 0))
            ):
                raise ReportRefusedError(
                    "each GPU in workbench_report needs a text uuid and whole-number index and memory_total_bytes"
                )
        if not all(isinstance(u, str) for u in job_gpus):
            raise ReportRefusedError("job_gpus in workbench_report must be a list of UUIDs")
    return accepted


def _short_texts(value: Any) -> bool:
    """True when every string in a JSON value is at most MAX_TEXT characters."""
    if isinstance(value, str):
        return len(value) <= MAX_TEXT
    if isinstance(value, dict):
        return all(_short_texts(k) and _short_texts(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_short_texts(v) for v in value)
    return True


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# Takes a job's port and GPU report for the spawner whose API token it presents.
StartReportHandler = start_report_handler("StartReportHandler", read_report)


def install(c: Config) -> None:
    """Serve ``StartReportHandler`` at batchspawner's address, and batchspawner's handler nowhere (idempotent).

    Called by the hub's config file (``setup_hub``), before JupyterHub builds its routes."""
    drop_batchspawner_handler()
    add_hub_route(c, ROUTE, StartReportHandler)


def drop_batchspawner_handler() -> None:
    """Take batchspawner's own handler out of JupyterHub's API routes: the one workaround, in one place.

    batchspawner registers ``/api/batchspawner`` by appending to ``jupyterhub.apihandlers.default_handlers``
    when it is imported (batchspawner/api.py: ``default_handlers.append((r"/api/batchspawner",
    BatchSpawnerAPIHandler))``, imported by its ``__init__``; jupyterhub/batchspawner#126), and offers no
    switch to leave it out. JupyterHub routes ``default_handlers`` before ``extra_handlers``
    (``JupyterHub.init_handlers``), so while that entry stands it answers instead of ours, and it sets any
    attribute a job posts. Importing ``batchspawner.api`` here first makes its append happen now, not
    after this removal; only batchspawner's entry is removed, nothing is added to the global list."""
    from batchspawner.api import BatchSpawnerAPIHandler

    apihandlers.default_handlers[:] = [h for h in apihandlers.default_handlers if h[1] is not BatchSpawnerAPIHandler]
