"""How servers ended, from the usage ledger: the admin page's recent stops and ``api/usage``'s counts.

The ledger (``gpu_usage``) keeps one row per GPU of each finished lease,
with why it ended (``ledger.reasons``) and, where the spawner recorded it,
the sentence the student was told (``message``). One *end* is one server's
lease: the rows of the same user, server, start and end.

* ``recent_stops(store, users=None)``: the newest ends (50), newest first,
  each with its GPUs, node, reason and sentence (the reason where no sentence
  was kept): everyone's on the fleet page, one user's on My GPUs;
* ``ends_by_reason(store, since, users)``: how many ends each reason kind
  (``reasons.reason_kind``: "reclaimed: GPU idle 30 min" is "reclaimed")
  counted since ``since``, for some users or all, so an admin reads "12
  servers ended out of memory this week in ml-course".
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from datetime import datetime

from sqlalchemy import select

from workbench_spawner.ledger.reasons import reason_kind
from workbench_spawner.ledger.store import AllocationStore, UsageRow, _aware

RECENT = 50
PAGE = 500
# The sentence column came with the ledger's reasons in words; a ledger without it falls back to the reason.
HAS_MESSAGE = hasattr(UsageRow, "message")
_COLUMNS = (
    UsageRow.id,
    UsageRow.user,
    UsageRow.server,
    UsageRow.started,
    UsageRow.ended,
    UsageRow.reason,
    UsageRow.node,
    UsageRow.gpu_uuid,
    *((UsageRow.message,) if HAS_MESSAGE else ()),
)


def _key(row) -> tuple:
    return (row.user, row.server, _aware(row.started), _aware(row.ended))


def _rows_newest_first(
    store: AllocationStore, since: datetime | None = None, users: Collection[str] | None = None
) -> Iterator:
    """The ledger's rows, newest end first, read a page at a time (an end's rows are adjacent); ``users``:
    only theirs (``gpu_usage.user`` is indexed)."""
    last = None
    while True:
        query = select(*_COLUMNS).order_by(UsageRow.ended.desc(), UsageRow.id.desc()).limit(PAGE)
        if since is not None:
            query = query.where(UsageRow.ended >= since)
        if users is not None:
            query = query.where(UsageRow.user.in_(sorted(users)))
        if last is not None:
            ended, row_id = last
            query = query.where((UsageRow.ended < ended) | ((UsageRow.ended == ended) & (UsageRow.id < row_id)))
        with store.reads()() as session:
            rows = session.execute(query).all()
        yield from rows
        if len(rows) < PAGE:
            return
        last = (rows[-1].ended, rows[-1].id)


def recent_stops(store: AllocationStore, limit: int = RECENT, users: Collection[str] | None = None) -> list[dict]:
    """The newest ``limit`` ends (``users``: only theirs, for My GPUs): ``{"ended", "user", "server", "gpus",
    "gpu_uuids", "node", "reason", "kind", "message"}``; ``message`` is the sentence the student was told,
    else the reason."""
    ends: dict[tuple, dict] = {}
    if users is not None and not users:
        return []
    for row in _rows_newest_first(store, users=users):
        key = _key(row)
        end = ends.get(key)
        if end is None:
            if len(ends) == limit:
                break
            message = (getattr(row, "message", "") or "") if HAS_MESSAGE else ""
            end = ends[key] = {
                "ended": _aware(row.ended).isoformat(),
                "started": _aware(row.started).isoformat(),
                "user": row.user,
                "server": row.server or "",
                "gpu_uuids": [],
                "node": row.node or "",
                "reason": row.reason or "",
                "kind": reason_kind(row.reason),
                "message": message or row.reason or "",
            }
        end["gpu_uuids"].append(row.gpu_uuid)
    for end in ends.values():
        end["gpus"] = len(end["gpu_uuids"])
    return list(ends.values())


def ends_by_reason(store: AllocationStore, since: datetime, users: Collection[str] | None = None) -> dict[str, int]:
    """Ends since ``since`` counted by reason kind, largest first (``users``: only theirs; None: everyone's)."""
    seen: set[tuple] = set()
    counts: dict[str, int] = {}
    if users is not None and not users:
        return {}
    for row in _rows_newest_first(store, since, users):
        key = _key(row)
        if key in seen:
            continue
        seen.add(key)
        kind = reason_kind(row.reason)
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
