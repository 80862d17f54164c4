"""Bring the pending notices (``workbench_spawner.ledger.notices``) to the user servers they are about.

Any rule that will stop a server (idle reclaim, a reservation's preemption)
only writes a notice with ``NoticeBook.warn``; this pass, run by the
service's reclaim loop every few seconds, puts each running server's
pending notices on its GPU monitor (``PUT api/gpu/notices``), which the
user's JupyterLab shows. A server's list is sent again when it changed, and
every ``resend_seconds`` anyway, because a restarted server forgot it. A
server that cannot be reached is logged and tried on the next pass.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from workbench_spawner.ledger.notices import NoticeBook

from .user_servers import ServerUnreachable, UserServers

log = logging.getLogger("workbench.service")


class NoticeDelivery:
    def __init__(self, book: NoticeBook, servers: UserServers, resend_seconds: float = 60.0, clock=time.monotonic):
        self.book = book
        self.servers = servers
        self.resend_seconds = resend_seconds
        self._clock = clock
        # (user, server) -> (what was sent, when)
        self._sent: dict[tuple[str, str], tuple[str, float]] = {}

    async def deliver(self, running: dict[tuple[str, str], str]) -> list[tuple[str, str]]:
        """``running``: (user, server name) -> the server's URL path; returns the servers written to."""
        pending = await asyncio.to_thread(self.book.pending)
        by_server: dict[tuple[str, str], list[dict]] = {}
        for notice in pending:
            by_server.setdefault((notice.user, notice.server), []).append(notice.to_json())
        written = []
        now = self._clock()
        for key, path in running.items():
            notices = by_server.get(key, [])
            last = self._sent.get(key)
            if not notices and last is None:
                continue  # never told anything: nothing to withdraw
            digest = json.dumps([{k: n[k] for k in ("id", "message", "hint", "stop_at")} for n in notices])
            if last is not None and last[0] == digest and now - last[1] < self.resend_seconds:
                continue
            try:
                await self.servers.put_notices(path, notices)
            except ServerUnreachable as exc:
                log.warning("Could not give %s/%s its notices: %s", key[0], key[1] or "default", exc)
                continue
            written.append(key)
            if notices:
                self._sent[key] = (digest, now)
            else:
                self._sent.pop(key, None)
        for key in [k for k in self._sent if k not in running]:
            del self._sent[key]  # the server is gone
        return written
