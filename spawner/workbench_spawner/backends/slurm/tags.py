"""The tag every job of ours carries in its comment: how a hub finds its own jobs again.

Written by ``sbatch_options`` (``--comment``), read back from ``squeue`` by
reconcile (after a hub restart), by a stop whose spawn never learned its job
id (``cancel_tagged``) and by fair share. Apart from Slurm's records because
it is the workbench's own format, not Slurm's.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

TAG_PREFIX = "workbench:"

_HUB_ID = re.compile(r"^(?P<hub>[0-9a-f]{6,32}):")


def job_tag(user: str, server: str, hub: str = "") -> str:
    """The tag every job of ours carries (``--comment``): how a restarted hub finds its jobs.

    ``workbench:<hub>:<user>/<server>``, where ``hub`` is the hub's id (kept in
    its GPU database, ``settings.hub_id``): two hubs on one cluster each find
    their own jobs and leave the other's alone. User and server are
    percent-quoted, so neither can contain the ``:`` or ``/`` that separate them.
    """
    who = f"{quote(user, safe='')}/{quote(server, safe='')}"
    return f"{TAG_PREFIX}{hub}:{who}" if hub else f"{TAG_PREFIX}{who}"


def parse_tag_with_hub(comment: str | None) -> tuple[str, str, str] | None:
    """(hub id, user, server) from a job's comment (hub id "" for a tag without one), or None."""
    text = (comment or "").strip()
    if not text.startswith(TAG_PREFIX):
        return None
    rest = text[len(TAG_PREFIX) :]
    hub = ""
    found = _HUB_ID.match(rest)
    if found:
        hub, rest = found.group("hub"), rest[found.end() :]
    if "/" not in rest:
        return None
    user, _, server = rest.partition("/")
    return (hub, unquote(user), unquote(server)) if user else None


def parse_tag(comment: str | None) -> tuple[str, str] | None:
    """(user, server) from a job's comment, or None for a job that is not ours."""
    parsed = parse_tag_with_hub(comment)
    return parsed[1:] if parsed else None
