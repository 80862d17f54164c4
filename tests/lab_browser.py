"""Browser steps shared by the tests that follow a person from the spawn form into JupyterLab.

A browser test that fails in CI is read from its message alone: the run's
containers, hub and page are gone by then. These helpers make every failure
say where the page was, what it showed and how the hub's log ended.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

from playwright.sync_api import Error as PlaywrightError

from tests.conftest import ARTIFACTS

LAB_PANEL = "#jp-main-dock-panel"
# How long a lab whose URL is reached may take to draw its main area before the page is loaded again
# (a lab draws it within seconds of its URL; one that waits on a dropped request never does).
LAB_DRAWN_MS = 60_000


def page_report(page, name: str, log: Callable[[], str] | None = None) -> str:
    """Screenshot ``page`` as ``tests/artifacts/<name>.png`` and describe it: URL, text shown, end of the hub log."""
    try:
        shown = page.inner_text("body", timeout=5_000)[-2000:]
    except PlaywrightError as e:  # a page that cannot be read says so, instead of hiding the real failure
        shown = f"(the page could not be read: {e})"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
    except PlaywrightError as e:
        shown += f"\n(no screenshot: {e})"
    tail = ""
    if log:
        try:
            tail = f"\nhub log, last lines:\n{log()[-4000:]}"
        except OSError as e:
            tail = f"\n(the hub log could not be read: {e})"
    return f"the page is at {page.url} and shows:\n{shown}{tail}"


@contextmanager
def explained(page, name: str, log: Callable[[], str] | None = None) -> Iterator[None]:
    """Run browser steps; a failure among them is raised again with :func:`page_report` attached."""
    try:
        yield
    except Exception as e:
        raise AssertionError(f"{e}\n{page_report(page, name, log)}") from e


def wait_for_lab(page, hub_url: str, user: str, timeout_ms: int = 180_000, log=None) -> None:
    """After the spawn form's submit: wait until the browser shows the user's JupyterLab.

    A browser on the hub's own host sees each network Docker makes for a spawn
    (a bridge or a pod's veth with an address on the host) as a change of its
    network and drops the requests in flight (``net::ERR_NETWORK_CHANGED``). A
    student's browser on another machine never sees it. Here the page is
    loaded again, as that user would, as often as it happens within the time
    allowed: from the spawn's progress page when the browser shows its error
    page, and the lab itself when it reached the lab's URL but stays on its
    splash because one of its first requests was dropped (JupyterLab does not
    ask again). Reaching the lab's URL is not enough: its main area must be drawn.

    On failure the message says where the page was, what it showed and, with
    ``log`` (a callable such as ``hub.log``), the end of the hub's log: a CI
    failure then says whether the spawn was slow or the page was stuck.
    """
    lab = re.compile(rf"^{re.escape(hub_url)}/user/{re.escape(user)}/lab")
    deadline = time.monotonic() + timeout_ms / 1000
    reloads: Counter[str] = Counter()
    while (left_ms := (deadline - time.monotonic()) * 1000) > 0:
        if page.url.startswith("chrome-error://"):
            reloads["from the browser's error page"] += 1
            try:
                page.goto(f"{hub_url}/hub/spawn-pending/{user}", timeout=max(left_ms, 1_000))
            except PlaywrightError:  # dropped again, or the hub is not there: the next turn sees the error page
                time.sleep(1)
        elif lab.match(page.url):
            try:
                page.wait_for_selector(LAB_PANEL, timeout=max(min(left_ms, LAB_DRAWN_MS), 1_000))
                return
            except PlaywrightError:
                if (deadline - time.monotonic()) * 1000 <= 1_000:
                    break
            reloads[f"the lab, not drawn in {LAB_DRAWN_MS / 1000:.0f} s"] += 1
            with suppress(PlaywrightError):
                page.reload(timeout=max(left_ms, 1_000))
        else:  # the spawn's progress page, which goes on to the lab by itself
            with suppress(PlaywrightError):
                page.wait_for_url(lab, timeout=max(min(left_ms, 2_000), 1))
    again = ", ".join(f"{why} ({n}x)" for why, n in reloads.items()) or "never"
    raise AssertionError(
        f"{user}'s browser was not in JupyterLab within {timeout_ms / 1000:.0f} s "
        f"(loaded again: {again}); {page_report(page, f'wait-for-lab-{user}', log)}"
    )
