"""``POST /hub/api/workbench/start-report``: a pod's report of the GPUs the device plugin gave it.

The workbench image's start-up (``workbench-start``, when the pod has
``WORKBENCH_START_REPORT=1``) posts ``{"node": <spec.nodeName>, "gpus":
[<UUIDs in NVIDIA_VISIBLE_DEVICES>]}`` with the server's API token before
Jupyter starts. Only the starting spawner that token belongs to takes it
(``start_report``), and only these two fields, each checked
here for shape; whether they are *true* (the pod's node, as many GPUs as it
asked for, GPUs of that node) is checked by the placement against what
Kubernetes says before any lease is written.
"""

from __future__ import annotations

from typing import Any

from traitlets.config import Config

from workbench_spawner.placement.engine_extension import add_hub_route
from workbench_spawner.placement.engine_report import ReportRefusedError, start_report_handler

__all__ = ["MAX_GPUS", "ROUTE", "PodReportHandler", "ReportRefusedError", "install", "read_report"]

ROUTE = r"/api/workbench/start-report"
MAX_GPUS = 64
MAX_TEXT = 256


def read_report(body: Any) -> dict[str, Any]:
    """The report as the spawner keeps it, or ReportRefusedError with the reason."""
    if not isinstance(body, dict):
        raise ReportRefusedError("the start report must be a JSON object with node and gpus")
    unknown = sorted(str(k)[:40] for k in body if k not in ("node", "gpus"))
    if unknown:
        raise ReportRefusedError(f"a start report carries only node and gpus; refused: {', '.join(unknown)}")
    node, gpus = body.get("node"), body.get("gpus")
    if not isinstance(node, str) or not node or len(node) > MAX_TEXT:
        raise ReportRefusedError("node must be the pod's node name (spec.nodeName)")
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
        raise ReportRefusedError(f"gpus must be a list of at most {MAX_GPUS} GPU UUIDs")
    if not all(isinstance(g, str) and 0 < len(g) <= MAX_TEXT for g in gpus):
        raise ReportRefusedError("each entry of gpus must be a GPU UUID (text)")
    return {"node": node, "gpus": list(gpus)}


def _accept(body: Any) -> tuple[dict[str, Any], list[str]]:
    return {"workbench_report": read_report(body)}, ["gpus", "node"]


# Takes a pod's node and GPUs for the starting spawner whose API token it presents.
PodReportHandler = start_report_handler(_accept, "PodReportHandler", requires="workbench_report")


def install(c: Config) -> None:
    """Serve the route on the hub's API (idempotent); the hub's config file calls it (``setup_hub``)."""
    add_hub_route(c, ROUTE, PodReportHandler)
