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

import json
from typing import Any

from jupyterhub.apihandlers import APIHandler
from tornado import web
from traitlets.config import Config

from workbench_spawner.placement.engine_extension import add_hub_route
from workbench_spawner.start_report import require_starting, token_spawner

ROUTE = r"/api/workbench/start-report"
MAX_GPUS = 64
MAX_TEXT = 256


class ReportRefused(ValueError):
    """A report that is not accepted; str(err) is the sentence the pod prints."""


def read_report(body: Any) -> dict[str, Any]:
    """The report as the spawner keeps it, or ReportRefused with the reason."""
    if not isinstance(body, dict):
        raise ReportRefused("the start report must be a JSON object with node and gpus")
    unknown = sorted(str(k)[:40] for k in body if k not in ("node", "gpus"))
    if unknown:
        raise ReportRefused(f"a start report carries only node and gpus; refused: {', '.join(unknown)}")
    node, gpus = body.get("node"), body.get("gpus")
    if not isinstance(node, str) or not node or len(node) > MAX_TEXT:
        raise ReportRefused("node must be the pod's node name (spec.nodeName)")
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
        raise ReportRefused(f"gpus must be a list of at most {MAX_GPUS} GPU UUIDs")
    if not all(isinstance(g, str) and 0 < len(g) <= MAX_TEXT for g in gpus):
        raise ReportRefused("each entry of gpus must be a GPU UUID (text)")
    return {"node": node, "gpus": list(gpus)}


class PodReportHandler(APIHandler):
    """Takes a pod's node and GPUs for the starting spawner whose API token it presents."""

    @web.authenticated
    def post(self) -> None:
        spawner = token_spawner(self)
        if not hasattr(spawner, "workbench_report"):
            raise web.HTTPError(400, "This server's backend takes no start report.")
        try:
            report = read_report(self.get_json_body())
        except ReportRefused as exc:
            raise web.HTTPError(400, f"Start report refused: {exc}.") from None
        require_starting(spawner)
        spawner.workbench_report = report
        self.set_status(201)
        self.finish(json.dumps({"message": "start report taken", "fields": ["gpus", "node"]}))


def install(c: Config) -> None:
    """Serve the route on the hub's API (idempotent); the hub's config file calls it (``setup_hub``)."""
    add_hub_route(c, ROUTE, PodReportHandler)
