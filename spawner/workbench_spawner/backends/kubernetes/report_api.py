"""``POST /hub/api/workbench/start-report``: a pod's report of the GPUs the device plugin gave it.

The workbench image's start-up (``workbench-start``, when the pod has
``WORKBENCH_START_REPORT=1``) posts ``{"node": <spec.nodeName>, "gpus":
[<UUIDs in NVIDIA_VISIBLE_DEVICES>]}`` with the server's API token before
Jupyter starts. Only the starting spawner that token belongs to takes it
(``engine_report``), and only these two fields, each checked
here for shape; whether they are *true* (the pod's node, as many GPUs as it
asked for, GPUs of that node) is checked by the placement against what
Kubernetes says before any lease is written.
"""

from __future__ import annotations

from typing import Any

from traitlets.config import Config

from workbench_spawner.placement.engine_extension import add_hub_route
from workbench_spawner.placement.engine_report import (
    MAX_GPUS,
    ReportRefusedError,
    is_text,
    report_fields,
    start_report_handler,
)

__all__ = ["ROUTE", "PodReportHandler", "install", "read_report"]

ROUTE = r"/api/workbench/start-report"


def read_report(body: Any) -> dict[str, Any]:
    """The report as the spawner keeps it, or ReportRefusedError with the reason."""
    report = report_fields(body, ("node", "gpus"), carry="carries only")
    node, gpus = report.get("node"), report.get("gpus")
    if not is_text(node):
        raise ReportRefusedError("node must be the pod's node name (spec.nodeName)")
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
        raise ReportRefusedError(f"gpus must be a list of at most {MAX_GPUS} GPU UUIDs")
    if not all(is_text(g) for g in gpus):
        raise ReportRefusedError("each entry of gpus must be a GPU UUID (text)")
    return {"node": node, "gpus": list(gpus)}


# Takes a pod's node and GPUs for the starting spawner whose API token it presents.
PodReportHandler = start_report_handler("PodReportHandler", read_report, keep_in="workbench_report")


def install(c: Config) -> None:
    """Serve the route on the hub's API (idempotent); the hub's config file calls it (``setup_hub``)."""
    add_hub_route(c, ROUTE, PodReportHandler)
