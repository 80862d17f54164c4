"""Save rounds: the lab saves open documents before the hub stops the server, and says how it went.

When a notice's countdown ends, and once more when the hub says it is stopping the server
now, every open lab tab saves its documents with unsaved changes and reports here. The
workbench service asks how the round went before it stops the server, so it stops at once
when every tab has saved, and waits (a little) when one has not yet.

``POST {base_url}api/gpu/saves``
    ``{"notice_id": str, "client": str, "saved": int, "failed": int, "names": [str]}``
    (``names``: the paths saved, at most 50; optional) -> 201 and the round as GET
    answers it; 400 with a
    sentence on bad input. Any authenticated user of the server may post: the lab runs as
    the user.
``GET {base_url}api/gpu/saves?notice_id=<id>``
    ``{"notice_id", "active_clients", "reported", "saved", "failed", "names", "done"}``:
    ``active_clients``: the tabs that had polled notices in the 30 s before the stopping
    notice arrived (before that, the tabs active now); ``reported``: how many of all tabs
    reported for this notice; ``saved``: documents saved over all reports; ``failed``: each
    tab's failures in its latest report (a later save retries what failed); ``done``: every
    such active tab reported (true when there was none).

State lives in memory, bounded: the last 32 rounds, 256 tabs, 50 names a round. A server
that restarts has no rounds, and its documents were saved or lost already.
"""

from __future__ import annotations

import json
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

SAVES_KEY = "workbench_gpu_monitor_saves"
ACTIVE_SECONDS = 30.0
MAX_ROUNDS = 32
MAX_CLIENTS = 256
MAX_NAMES = 50
MAX_NAME_LENGTH = 1024
MAX_NOTICE_ID = 128
MAX_COUNT = 100_000
CLIENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
REPORT_FIELDS = {"notice_id", "client", "saved", "failed", "names"}


class SaveError(ValueError):
    """Bad input; the message is a sentence for the person (or program) that sent it."""


def _count(body: dict, key: str) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise SaveError(f"{key} must be a whole number of documents from 0 to {MAX_COUNT}")
    return value


def parse_notice_id(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_NOTICE_ID:
        raise SaveError(f"notice_id must be the notice's id (text of 1 to {MAX_NOTICE_ID} characters)")
    return value


def parse_report(body: Any) -> dict:
    """Check a POST body; raise SaveError with a sentence."""
    if not isinstance(body, dict):
        raise SaveError('the body must be {"notice_id": ..., "client": ..., "saved": n, "failed": n, "names": [...]}')
    unknown = sorted(set(body) - REPORT_FIELDS)
    if unknown:
        raise SaveError(f"unknown field(s): {', '.join(unknown)}")
    notice_id = parse_notice_id(body.get("notice_id"))
    client = body.get("client")
    if not isinstance(client, str) or not CLIENT_ID.fullmatch(client):
        raise SaveError("client must be the tab's short id: letters, digits, - and _, at most 64 characters")
    names = body.get("names", [])
    if not isinstance(names, list) or len(names) > MAX_NAMES:
        raise SaveError(f"names must be a list of at most {MAX_NAMES} paths")
    if not all(isinstance(n, str) and 0 < len(n) <= MAX_NAME_LENGTH for n in names):
        raise SaveError(f"each name must be a document's path (text of 1 to {MAX_NAME_LENGTH} characters)")
    return {
        "notice_id": notice_id,
        "client": client,
        "saved": _count(body, "saved"),
        "failed": _count(body, "failed"),
        "names": names,
    }


class SaveRounds:
    """Which tabs poll, and per notice which of them reported their saves; plain, bounded, in memory."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last_poll: dict[str, float] = {}
        # notice id -> {"expected": set|None, "reports": {client: {"saved","failed"}}, "saved", "names"}
        self.rounds: OrderedDict[str, dict] = OrderedDict()

    def active_clients(self) -> set[str]:
        cutoff = self.clock() - ACTIVE_SECONDS
        return {c for c, t in self.last_poll.items() if t >= cutoff}

    def polled(self, client: str) -> None:
        now = self.clock()
        self.last_poll.pop(client, None)
        self.last_poll[client] = now  # newest last, so the oldest go first when full
        if len(self.last_poll) > MAX_CLIENTS:
            cutoff = now - ACTIVE_SECONDS
            for old in [c for c, t in self.last_poll.items() if t < cutoff]:
                del self.last_poll[old]
            while len(self.last_poll) > MAX_CLIENTS:
                del self.last_poll[next(iter(self.last_poll))]

    def _round(self, notice_id: str) -> dict:
        found = self.rounds.get(notice_id)
        if found is None:
            found = {"expected": None, "reports": {}, "saved": 0, "names": []}
            self.rounds[notice_id] = found
            while len(self.rounds) > MAX_ROUNDS:
                self.rounds.popitem(last=False)
        return found

    def stopping(self, notice_id: str) -> None:
        """The hub says it stops the server now: the tabs active at this moment are the ones to wait for.

        Only the first stopping notice of an id counts: the hub repeats it on every pass."""
        found = self._round(notice_id)
        if found["expected"] is None:
            found["expected"] = self.active_clients()

    def report(self, report: dict) -> None:
        client = report["client"]
        known = self.rounds.get(report["notice_id"])
        if known is not None and client not in known["reports"] and len(known["reports"]) >= MAX_CLIENTS:
            raise SaveError(f"at most {MAX_CLIENTS} tabs report for one notice")
        found = self._round(report["notice_id"])
        found["reports"][client] = {"failed": report["failed"]}
        found["saved"] += report["saved"]
        for name in report["names"]:
            if name not in found["names"] and len(found["names"]) < MAX_NAMES:
                found["names"].append(name)

    def summary(self, notice_id: str) -> dict:
        found = self.rounds.get(notice_id) or {"expected": None, "reports": {}, "saved": 0, "names": []}
        expected = found["expected"] if found["expected"] is not None else self.active_clients()
        reported = found["reports"]
        return {
            "notice_id": notice_id,
            "active_clients": len(expected),
            "reported": len(reported),
            "saved": found["saved"],
            "failed": sum(r["failed"] for r in reported.values()),
            "names": list(found["names"]),
            "done": expected <= set(reported),
        }


class GPUSavesHandler(APIHandler):
    auth_resource = "api"

    @property
    def rounds(self) -> SaveRounds:
        return self.settings.setdefault(SAVES_KEY, SaveRounds())

    @web.authenticated
    @authorized
    async def get(self):
        try:
            notice_id = parse_notice_id(self.get_argument("notice_id", None))
        except SaveError as exc:
            raise web.HTTPError(400, f"{exc}: GET api/gpu/saves?notice_id=<id>") from None
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(self.rounds.summary(notice_id)))

    @web.authenticated
    @authorized
    async def post(self):
        try:
            body = json.loads(self.request.body or b"null")
        except ValueError:
            raise web.HTTPError(400, "the body is not JSON") from None
        try:
            report = parse_report(body)
            self.rounds.report(report)
        except SaveError as exc:
            raise web.HTTPError(400, str(exc)) from None
        self.log.info(
            "GPU monitor: tab %s saved %d, failed %d document(s) for notice %s",
            report["client"],
            report["saved"],
            report["failed"],
            report["notice_id"],
        )
        self.set_status(201)
        self.finish(json.dumps(self.rounds.summary(report["notice_id"])))
