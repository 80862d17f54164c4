"""A hub shut down through its API says who asked, to every student whose server it stops.

``POST /hub/api/shutdown`` stops the servers after its request, in the clean-up ``JupyterHub.stop()``
schedules, with no request handler on the stack for ``stop_requester`` to read. The request's log line
(tornado's ``log_function``, wrapped by ``note_shutdown_requests``) notes who asked in its task's context,
which that clean-up copies; a real hub's shutdown is tests/integration/test_stop_reasons.py's.
"""

from __future__ import annotations

import asyncio
import contextvars
from types import SimpleNamespace

import pytest
from jupyterhub.apihandlers.hub import ShutdownAPIHandler
from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.log import log_request
from traitlets.config import Config

from workbench_spawner.ledger import endings, reasons
from workbench_spawner.stop_requester import note_shutdown_requests, noting_shutdowns, requested_by, shutdown_reason

ADA = SimpleNamespace(kind="user", name="ada")
SCRIPT = SimpleNamespace(kind="service", name="workbench-admin")


@pytest.mark.parametrize(
    ("requester", "reason", "ledger", "sentence"),
    [
        (ADA, reasons.STOPPED_BY_ADMIN, "stopped by an admin: ada, hub shutdown",
         "An admin (ada) shut the hub down and stopped its servers."),
        (SCRIPT, reasons.STOPPED_BY_SERVICE, "stopped by a service: workbench-admin, hub shutdown",
         "The hub service workbench-admin shut the hub down and stopped its servers."),
    ],
)  # fmt: skip
def test_who_shut_the_hub_down_is_told(requester, reason, ledger, sentence):
    ending = shutdown_reason(requester)
    assert ending is not None
    assert (ending.reason, ending.ledger_reason, ending.message) == (reason, ledger, sentence)
    assert reasons.reason_kind(ending.ledger_reason) == reason


def test_a_shutdown_nobody_on_record_asked_for_says_only_that_the_hub_stopped():
    assert shutdown_reason(None) is None
    assert shutdown_reason(SimpleNamespace(kind="deleted", name="x")) is None
    plain = endings.stopped_by_hub()
    assert (plain.ledger_reason, plain.message) == (
        reasons.STOPPED,
        "The hub stopped this server (it was shutting down or restarting).",
    )


def handler(cls: type, status: int, requester: object) -> object:
    """A request handler of ``cls`` as tornado's log call sees it once the request is answered."""
    made = cls.__new__(cls)
    made._status_code = status
    made._jupyterhub_user = requester  # its current_user, as JupyterHub's prepare() set it
    return made


def logged_in_a_request(*handlers: object) -> tuple[list[object], object]:
    """Run the noting log function for ``handlers`` in one request task's context, then, as JupyterHub's
    ``stop()`` does, schedule a clean-up from that task: what it reads as who asked for the stop of ann's
    server. Returns (the handlers the wrapped log function got, that answer)."""
    logged: list[object] = []
    log = noting_shutdowns(logged.append)

    async def main() -> object:
        async def request_task() -> asyncio.Future:
            for h in handlers:
                log(h)
            cleanup: asyncio.Future = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(stopping(cleanup)))
            return cleanup

        async def stopping(done: asyncio.Future) -> None:
            await asyncio.sleep(0)
            done.set_result(requested_by("ann"))

        return await (await asyncio.create_task(request_task()))

    answer = contextvars.copy_context().run(asyncio.run, main())
    return logged, answer


def test_the_clean_up_of_an_accepted_shutdown_finds_who_asked():
    accepted = handler(ShutdownAPIHandler, 202, ADA)
    logged, answer = logged_in_a_request(accepted)
    assert logged == [accepted]  # the request's own log line still written
    assert answer == endings.stopped_by_hub(admin="ada")
    assert requested_by("ann") is None  # only the request's task, and what it started, know


@pytest.mark.parametrize(
    "answered",
    [
        handler(ShutdownAPIHandler, 400, ADA),  # refused: "servers must be true or false"
        handler(ShutdownAPIHandler, 403, ADA),  # no shutdown scope
        handler(UserServerAPIHandler, 202, ADA),  # another request: a stop of one server
    ],
)
def test_nothing_is_noted_for_any_other_answer(answered):
    assert logged_in_a_request(answered)[1] is None


def test_the_hubs_log_function_is_wrapped_and_a_sites_own_kept():
    c = Config()
    note_shutdown_requests(c)
    wrapped = c.JupyterHub.tornado_settings["log_function"]
    assert wrapped.__closure__ is not None
    assert log_request in [cell.cell_contents for cell in wrapped.__closure__]

    site_log: list[object] = []
    c = Config()
    c.JupyterHub.tornado_settings = {"headers": {"X-Site": "1"}, "log_function": site_log.append}
    note_shutdown_requests(c)
    settings = c.JupyterHub.tornado_settings
    assert settings["headers"] == {"X-Site": "1"}
    answered = handler(UserServerAPIHandler, 204, ADA)
    settings["log_function"](answered)
    assert site_log == [answered]
