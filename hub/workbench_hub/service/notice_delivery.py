"""Bring the pending notices (``workbench_spawner.ledger.notices``) to the user servers they are about.

Any rule that will stop a server (idle reclaim, a reservation's preemption)
only writes a notice with ``NoticeBook.warn``; this pass, run by the
service's reclaim loop every few seconds, puts each running server's
pending notices on its GPU monitor (``PUT api/gpu/notices``), which the
user's JupyterLab shows. With them go the server's time-sliced GPUs
(``time_sliced``): how many servers each takes and how many others hold it
now, so the user's status bar says "GPU shared with 2 others". A server's
list is sent again when it changed, and every ``resend_seconds`` anyway,
because a restarted server forgot it. A server that cannot be reached is
logged and tried on the next pass.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.store import Lease

from .user_servers import ServerUnreachableError, UserServers

log = logging.getLogger("workbench.service")
Sharing = dict[tuple[str, str], list[dict]]


def time_sliced(leases: Sequence[Lease], slots: Mapping[str, int]) -> Sharing:
    """(user, server) -> its GPUs that several servers may share (``slots`` above 1), each with how many
    servers it takes and how many *other* servers hold it now (``{"uuid", "slots", "others"}``).
    A server on GPUs it holds alone is not listed."""
    holders: dict[str, int] = {}
    for lease in leases:
        for uuid in lease.gpu_uuids:
            holders[uuid] = holders.get(uuid, 0) + 1
    sharing: Sharing = {}
    for lease in leases:
        for uuid in lease.gpu_uuids:
            if slots.get(uuid, 1) > 1:
                entry = {"uuid": uuid, "slots": slots[uuid], "others": holders[uuid] - 1}
                sharing.setdefault((lease.user, lease.server), []).append(entry)
    return sharing


class NoticeDelivery:
    def __init__(
        self,
        book: NoticeBook,
        servers: UserServers,
        resend_seconds: float = 60.0,
        clock=time.monotonic,
        sharing: Callable[[], Sharing] | None = None,
    ):
        self.book = book
        self.servers = servers
        self.resend_seconds = resend_seconds
        self._clock = clock
        # Blocking (reads the database): the time-sliced GPUs of every server (``time_sliced``).
        self._sharing = sharing
        # (user, server) -> (what was sent, when)
        self._sent: dict[tuple[str, str], tuple[str, float]] = {}

    async def deliver(self, running: dict[tuple[str, str], str]) -> list[tuple[str, str]]:
        """``running``: (user, server name) -> the server's URL path; returns the servers written to."""
        pending = await asyncio.to_thread(self.book.pending)
        shared = await asyncio.to_thread(self._sharing) if self._sharing is not None else {}
        by_server: dict[tuple[str, str], list[dict]] = {}
        for notice in pending:
            by_server.setdefault((notice.user, notice.server), []).append(notice.to_json())
        written = []
        now = self._clock()
        for key, path in running.items():
            notices, sharing = by_server.get(key, []), shared.get(key, [])
            last = self._sent.get(key)
            if not notices and not sharing and last is None:
                continue  # never told anything: nothing to withdraw
            digest = json.dumps([[{k: n[k] for k in ("id", "message", "hint", "stop_at")} for n in notices], sharing])
            if last is not None and last[0] == digest and now - last[1] < self.resend_seconds:
                continue
            try:
                await self.servers.put_notices(path, notices, sharing)
            except ServerUnreachableError as exc:
                log.warning("Could not give %s/%s its notices: %s", key[0], key[1] or "default", exc)
                continue
            written.append(key)
            if notices or sharing:
                self._sent[key] = (digest, now)
            else:
                self._sent.pop(key, None)
        for key in [k for k in self._sent if k not in running]:
            del self._sent[key]  # the server is gone
        return written
