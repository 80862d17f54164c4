"""What the hub side tells this server's user: "your server will be stopped at T because ...".

The workbench service (on the hub) decides that a server is to be stopped
(its GPUs stayed idle, a reservation takes them back) and, until then, posts
the notice here on every pass; the JupyterLab extension reads it and shows a
notification and a status-bar countdown. The hub pushes rather than this
server pulling because every backend lets the hub reach a user server (the
proxy routes to it) while the user server cannot always reach the service.

``GET {base_url}api/gpu/notices``
    ``{"now": iso, "notices": [{"id", "kind", "message", "hint", "stop_at",
    "stopping", "seconds_left"}], "sharing": [{"uuid", "slots", "others"}]}``: the live
    notices, ``seconds_left`` counted from this server's clock so a browser
    with a wrong clock still counts down right; ``sharing``: this server's
    time-sliced GPUs, how many servers each takes and how many other servers
    hold it now (the status bar says "GPU shared with 2 others"). ``stopping``
    is true when the hub is stopping the server now (it says so once more
    right before it stops it). ``?client=<id>``: the lab tab that polls (a
    token of letters, digits, ``-`` and ``_``, at most 64); the server
    remembers when each tab last polled, to know who must report a save
    round (``saves.py``).
``PUT {base_url}api/gpu/notices``
    Replaces the whole list (``{"notices": [...], "sharing": [...]}``; an
    empty list withdraws them; ``sharing`` left out is an empty list).
    Under JupyterHub only a service (the workbench service's token, with
    ``access:servers``) may do this; the user reads, never writes, so a
    browser script cannot hide a warning from its user by accident.
    Every PUT also writes the notices for kernels, atomically and readable
    only by the user, to ``workbench-notices.json`` in the Jupyter runtime
    directory, where ``on_stop`` (``stop_notice.py``) watches them.

Notices live in memory: a server that restarts has none until the next pass
of the service (seconds), which posts them again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from datetime import UTC, datetime
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from .saves import SAVES_KEY, SaveRounds
from .stop_notice import notices_path

NOTICES_KEY = "workbench_gpu_monitor_notices"
SHARING_KEY = "workbench_gpu_monitor_sharing"
MAX_SHARED = 64
MAX_NOTICES = 16
MAX_TEXT = 2000
FIELDS = ("id", "kind", "message", "hint", "stop_at", "stopping")
CLIENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class NoticeError(ValueError):
    pass


def _parse_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise NoticeError("stop_at must be an ISO 8601 time such as 2026-12-03T10:30:00+00:00, or null")
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise NoticeError(f"stop_at {json.dumps(value)[:60]} is not an ISO 8601 time") from None
    if when.tzinfo is None:
        raise NoticeError("stop_at must carry a time zone (for example +00:00)")
    return when


def parse_notices(body: Any) -> list[dict]:
    """Check a PUT body; raise NoticeError with a sentence."""
    if not isinstance(body, dict) or not isinstance(body.get("notices"), list):
        raise NoticeError('the body must be {"notices": [...]}')
    if len(body["notices"]) > MAX_NOTICES:
        raise NoticeError(f"at most {MAX_NOTICES} notices at once")
    notices = []
    for item in body["notices"]:
        if not isinstance(item, dict):
            raise NoticeError("each notice must be a JSON object")
        unknown = sorted(
            set(item) - set(FIELDS) - {"seconds_left", "server", "user", "state", "reason", "created", "updated"}
        )
        if unknown:
            raise NoticeError(f"unknown notice field(s): {', '.join(unknown)}")
        if isinstance(item.get("id"), bool) or not isinstance(item.get("id"), (int, str)):
            raise NoticeError("each notice needs an id (a number or a string)")
        for key in ("kind", "message"):
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise NoticeError(f"each notice needs a {key} (text)")
        hint = item.get("hint") or ""
        if not isinstance(hint, str):
            raise NoticeError("hint must be text")
        if any(len(str(item.get(k) or "")) > MAX_TEXT for k in ("message", "hint")):
            raise NoticeError(f"message and hint are at most {MAX_TEXT} characters")
        stopping = item.get("stopping")
        if stopping is None:
            stopping = False
        elif not isinstance(stopping, bool):
            raise NoticeError("stopping must be true or false (true: the hub is stopping this server now)")
        notices.append(
            {
                "id": str(item["id"]),
                "kind": item["kind"][:32],
                "message": item["message"],
                "hint": hint,
                "stop_at": _parse_time(item.get("stop_at")),
                "stopping": stopping,
            }
        )
    return notices


def parse_sharing(body: dict) -> list[dict]:
    """The time-sliced GPUs of a PUT body (checked after ``parse_notices``); raise NoticeError with a sentence."""
    items = body.get("sharing", [])
    if not isinstance(items, list) or len(items) > MAX_SHARED:
        raise NoticeError(f"sharing must be a list of at most {MAX_SHARED} GPUs")
    sharing = []
    for item in items:
        if not isinstance(item, dict) or set(item) != {"uuid", "slots", "others"}:
            raise NoticeError('each sharing entry must be {"uuid": ..., "slots": ..., "others": ...}')
        uuid, slots, others = item["uuid"], item["slots"], item["others"]
        if not isinstance(uuid, str) or not 0 < len(uuid) <= 128:
            raise NoticeError("a sharing entry's uuid must be a GPU's UUID (text)")
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (slots, others)):
            raise NoticeError("a sharing entry's slots and others must be whole numbers")
        if slots < 2 or not 0 <= others < slots:
            raise NoticeError(
                f"sharing of {uuid}: a time-sliced GPU takes at least 2 servers (slots) and others holders "
                f"besides this server must be fewer than slots, not slots={slots}, others={others}"
            )
        sharing.append({"uuid": uuid, "slots": slots, "others": others})
    return sharing


def render(notices: list[dict], sharing: list[dict], now: datetime | None = None) -> dict:
    now = now or datetime.now(UTC)
    out = []
    for n in notices:
        stop_at = n["stop_at"]
        left = None if stop_at is None else max(0.0, (stop_at - now).total_seconds())
        out.append({**n, "stop_at": stop_at.isoformat() if stop_at else None, "seconds_left": left})
    return {"now": now.isoformat(), "notices": out, "sharing": sharing}


def parse_client(value: str | None) -> str | None:
    """The polling tab's id from ``?client=``; None when absent; NoticeError with a sentence when malformed."""
    if value is None:
        return None
    if not CLIENT_ID.fullmatch(value):
        raise NoticeError("client must be a short id of letters, digits, - and _ (at most 64 characters)")
    return value


def for_kernels(notices: list[dict], now: datetime | None = None) -> dict:
    """The kernels' file (``on_stop`` reads it): the live notices, without what only people read."""
    return {
        "written": (now or datetime.now(UTC)).isoformat(),
        "notices": [
            {
                "id": n["id"],
                "kind": n["kind"],
                "message": n["message"],
                "stop_at": n["stop_at"].isoformat() if n["stop_at"] else None,
                "stopping": n.get("stopping", False),
            }
            for n in notices
        ],
    }


def write_for_kernels(notices: list[dict], path: str | None = None) -> str:
    """Replace the kernels' notices file atomically (temp file + rename), mode 0600; return its path.

    Atomic so a kernel never reads half a file; 0600 because other users of a shared host
    must not learn when this user's server stops."""
    path = path or notices_path()
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".workbench-notices-", suffix=".tmp", dir=directory)  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(for_kernels(notices), fh)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


class GPUNoticesHandler(APIHandler):
    auth_resource = "api"

    @property
    def notices(self) -> list[dict]:
        return self.settings.setdefault(NOTICES_KEY, [])

    @property
    def rounds(self) -> SaveRounds:
        return self.settings.setdefault(SAVES_KEY, SaveRounds())

    @web.authenticated
    @authorized
    async def get(self):
        try:
            client = parse_client(self.get_argument("client", None))
        except NoticeError as exc:
            raise web.HTTPError(400, str(exc)) from None
        if client is not None:
            self.rounds.polled(client)
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(render(self.notices, self.settings.get(SHARING_KEY, []))))

    @web.authenticated
    @authorized
    async def put(self):
        hub_user = getattr(self.current_user, "hub_user", None)
        if os.environ.get("JUPYTERHUB_API_TOKEN") and (
            not isinstance(hub_user, dict) or hub_user.get("kind") != "service"
        ):
            raise web.HTTPError(403, "only the hub's workbench service posts notices; users read them")
        try:
            body = json.loads(self.request.body or b"null")
        except ValueError:
            raise web.HTTPError(400, "the body is not JSON") from None
        try:
            parsed = parse_notices(body)
            sharing = parse_sharing(body)
        except NoticeError as exc:
            raise web.HTTPError(400, str(exc)) from None
        self.settings[NOTICES_KEY] = parsed
        self.settings[SHARING_KEY] = sharing
        for notice in parsed:
            if notice["stopping"]:
                self.rounds.stopping(notice["id"])  # who must report a save: the tabs active now
        try:
            write_for_kernels(parsed)
        except OSError as exc:
            self.log.warning("GPU monitor: cannot write the notices for kernels: %s", exc)
        self.log.info("GPU monitor: %d notice(s), %d time-sliced GPU(s) from the hub", len(parsed), len(sharing))
        self.finish(json.dumps(render(parsed, sharing)))
