"""``POST /hub/api/batchspawner``: a Slurm job's start report, and nothing more.

batchspawner 1.3.0 registers a handler at this address that sets *any*
attribute of the spawner that a job posts (``setattr`` for every key). The
job runs as the user and holds the server's API token, so a user could post
``{"exec_prefix": "", "batch_cancel_cmd": "..."}`` and have the hub run that
command, as the hub's own account (root on a Slurm head node), at the next
stop. This module puts a handler in its place that takes exactly what a
start needs: ``port`` (the server's port on the node) and
``workbench_report`` (the node's GPUs and the job's, see
``slurm_singleuser``), each checked, and only while that spawner is
starting. Anything else is a 400 with a sentence and changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from jupyterhub import apihandlers
from jupyterhub.apihandlers import APIHandler
from tornado import web

from workbench_spawner.backends.slurm.jobs import NodeReport
from workbench_spawner.start_report import require_starting, token_spawner

ROUTE = r"/api/batchspawner"
ALLOWED_KEYS = ("port", "workbench_report")
MAX_REPORTED_GPUS = 64
MAX_TEXT = 256


class ReportRefused(ValueError):
    """A start report that is not accepted; str(err) is the sentence the job prints."""


def _short_texts(value: Any) -> bool:
    """True when every string in a JSON value is at most MAX_TEXT characters."""
    if isinstance(value, str):
        return len(value) <= MAX_TEXT
    if isinstance(value, dict):
        return all(_short_texts(k) and _short_texts(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_short_texts(v) for v in value)
    return True


def read_report(body: Any) -> dict[str, Any]:
    """The accepted fields of a start report, or ReportRefused with the reason."""
    if not isinstance(body, dict):
        raise ReportRefused("the start report must be a JSON object with port and workbench_report")
    unknown = sorted(str(k)[:40] for k in body if k not in ALLOWED_KEYS)
    if unknown:
        raise ReportRefused(
            f"a start report may carry only {' and '.join(ALLOWED_KEYS)}; refused: {', '.join(unknown)}"
        )
    accepted: dict[str, Any] = {}
    if "port" in body:
        port = body["port"]
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ReportRefused(f"port must be a whole number from 1 to 65535, not {str(port)[:20]!r}")
        accepted["port"] = port
    if "workbench_report" in body:
        report = body["workbench_report"]
        if NodeReport.from_json(report) is None:
            raise ReportRefused("workbench_report must be an object naming the node, its GPUs and the job's")
        if len(report.get("gpus") or []) > MAX_REPORTED_GPUS or len(report.get("job_gpus") or []) > MAX_REPORTED_GPUS:
            raise ReportRefused(f"workbench_report lists more than {MAX_REPORTED_GPUS} GPUs")
        if not _short_texts(report):
            raise ReportRefused(f"workbench_report has a text longer than {MAX_TEXT} characters")
        for gpu in report.get("gpus") or []:
            if not (
                isinstance(gpu, dict)
                and isinstance(gpu.get("uuid"), str)
                and _whole(gpu.get("index"))
                and _whole(gpu.get("memory_total_bytes", 0))
            ):
                raise ReportRefused(
                    "each GPU in workbench_report needs a text uuid and whole-number index and memory_total_bytes"
                )
        if not all(isinstance(u, str) for u in report.get("job_gpus") or []):
            raise ReportRefused("job_gpus in workbench_report must be a list of UUIDs")
        accepted["workbench_report"] = report
    if not accepted:
        raise ReportRefused("the start report carries neither port nor workbench_report")
    return accepted


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class StartReportHandler(APIHandler):
    """Takes a job's port and GPU report for the spawner whose API token it presents."""

    @web.authenticated
    def post(self) -> None:
        spawner = token_spawner(self)
        try:
            accepted = read_report(self.get_json_body())
        except ReportRefused as exc:
            raise web.HTTPError(400, f"Start report refused: {exc}.") from None
        require_starting(spawner)
        for key, value in accepted.items():
            setattr(spawner, key, value)
        self.set_status(201)
        self.finish(json.dumps({"message": "start report taken", "fields": sorted(accepted)}))


def install() -> None:
    """Put ``StartReportHandler`` where batchspawner's handler was (idempotent).

    Called when the Slurm backend is imported, which JupyterHub does while
    loading its config, before it builds its routes from ``default_handlers``.
    """
    handlers = apihandlers.default_handlers
    handlers[:] = [h for h in handlers if h[0] != ROUTE]
    handlers.append((ROUTE, StartReportHandler))
