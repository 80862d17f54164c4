"""The hub's home page says why a server stopped, as the spawn page does, until the next start.

JupyterHub 6 renders ``/hub/home`` from ``home.html``. Ours
(``templates/home.html`` beside this file) extends JupyterHub's own
(``templates/home.html``, JupyterHub's prefix loader for its built-in pages)
and puts, above it, the spawn page's stop box
(``workbench_spawner.ledger.notices.render_stop_notice``) for the newest
``done`` notice of each of the user's servers that is not running: the
default server, and named servers where the hub allows them (their box
names them). Starting a server forgets its notice (``NoticeBook.acknowledge``),
so the box stays until the next start.

The data comes through ``JupyterHub.template_vars``, whose callable values
JupyterHub 6 calls with the current user for every page it renders. Ours
returns a lazy value that reads the GPU database only when a template prints
it, so only the home page pays the read (one indexed row per server); the
GPU database is opened on first use.

``update_home_page(c, db_url)`` wires it, after the authenticator's and the
site's template paths (a site's own ``home.html`` still wins); the end of
the hub's config (``finish.py``, on a host and in the z2jh chart's hub pod)
calls it once the GPU database's URL is settled.
"""

from __future__ import annotations

import logging
import threading
from html import escape
from pathlib import Path
from typing import Any

from markupsafe import Markup
from traitlets.config import Config

from workbench_spawner.ledger.notices import NoticeBook, render_stop_notice

log = logging.getLogger("workbench.hub")

TEMPLATES = Path(__file__).parent / "templates"
VARIABLE = "workbench_stop_boxes"


class StopNotices:
    """The GPU database's ``done`` notices, opened on first use (one per hub process)."""

    def __init__(self, db_url: str):
        self.db_url = db_url
        self._book: NoticeBook | None = None
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> StopNotices:
        # traitlets copies config values; one process-wide reader (and its lock) is what every copy means.
        return self

    @property
    def book(self) -> NoticeBook:
        with self._lock:
            if self._book is None:
                from workbench_spawner.ledger.store import AllocationStore

                self._book = NoticeBook(AllocationStore(self.db_url))
            return self._book

    def boxes(self, user: Any) -> str:
        """The stop boxes for ``user`` (a JupyterHub ``User``): the default server's, then each named one's."""
        names = [""]
        if getattr(user, "allow_named_servers", False):
            names += sorted(name for name in user.orm_user.orm_spawners if name)
        html = []
        for name in names:
            spawner = user.spawners.get(name)
            if spawner is not None and spawner.active:
                continue  # running or starting: whatever stopped it before is no longer news
            box = render_stop_notice(self.book.last_done(user.name, name))
            if box and name:
                box = (
                    f'<div class="workbench-stop-named" data-server="{escape(name)}">'
                    f"<p>Server <strong>{escape(name)}</strong>:</p>{box}</div>"
                )
            html.append(box)
        return "".join(html)

    def __call__(self, user: Any) -> StopBoxes | str:
        return "" if user is None else StopBoxes(self, user)


class StopBoxes:
    """Printed by the home page (``__html__``); other pages never print it, so never read the database."""

    def __init__(self, notices: StopNotices, user: Any):
        self.notices = notices
        self.user = user

    def __html__(self) -> Markup:
        try:
            return Markup(self.notices.boxes(self.user))
        except Exception as exc:  # noqa: BLE001 - boundary: the home page must render whatever the GPU database does
            log.warning("The home page's stop box for %s could not be read: %s", getattr(self.user, "name", "?"), exc)
            return Markup("")

    __str__ = __html__


def update_home_page(c: Config, db_url: str) -> None:
    """Our ``home.html`` after the template paths set so far, and the stop boxes in ``template_vars``."""
    paths = list(c.JupyterHub.template_paths) if "template_paths" in c.JupyterHub else []
    if str(TEMPLATES) not in paths:
        paths.append(str(TEMPLATES))
    c.JupyterHub.template_paths = paths
    variables = dict(c.JupyterHub.template_vars) if "template_vars" in c.JupyterHub else {}
    c.JupyterHub.template_vars = {**variables, VARIABLE: StopNotices(db_url)}
