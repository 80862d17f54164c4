"""Start the workbench service: ``WORKBENCH_DB_URL=URL python -m workbench_hub.service --port=N``.

The hub starts it as a managed service (``hub/jupyterhub_config.py``) with
only the GPU database's URL in its environment (``--db-url`` overrides it):
everything the policy
decides (inventory, servers per GPU, the default quota, the node) is read
from the settings the hub stored in that database, never from environment
variables (see ``fleet.py``). ``--session-check-seconds`` (default
``$WORKBENCH_SESSION_CHECK_SECONDS`` or 60; 0 turns it off) sets how often
over-long sessions are warned about (the idle rule's warning lead before)
and stopped. ``--idle-check-seconds`` (default 30; 0 off)
runs the idle-GPU reclaim loop and delivers notices (``gpu_reclaim.py``);
``--proxy-url`` is how it reaches user servers (their GPU monitor).
``--save-wait-seconds`` (``$WORKBENCH_SAVE_WAIT_SECONDS`` or 20) is how long
a stop for the hub's own reasons waits for open notebooks to be saved
(``stopping.py``). ``--reservation-check-seconds`` (15) paces preemption and
the stops of drains with a countdown (``drain_stops.py``). How the service
itself stops is in ``lifetime.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

from tornado import web

from workbench_hub.service.openapi import load_document, load_fragment
from workbench_spawner.backend import extension_of, openapi_fragments
from workbench_spawner.ledger.migrations import UnusableDatabaseError
from workbench_spawner.ledger.store import AllocationStore

from . import course_handlers as ch
from . import course_staff_handlers as csh
from . import handlers as h
from . import page_handlers as pages
from . import reservation_handlers as rh
from .access_log import hide_oauth_state, log_request
from .course_ends import stop_ended_courses
from .course_pages import CourseListPageHandler, CoursePageHandler
from .drain_handlers import drain_routes
from .drain_stops import DrainStops
from .fleet import Fleet
from .gpu_reclaim import make_reclaimer
from .headers import SecurityHeaders
from .hub_client import HubClient
from .idle_handlers import idle_routes
from .lifetime import CannotListenError, Lifetime, listen
from .my_gpus import MyGPUsHandler
from .roster_handlers import CourseRosterHandler
from .session_limits import stop_overlong_servers
from .stopping import make_stopper
from .usage_handlers import UsageHandler
from .user_servers import UserServers

log = logging.getLogger("workbench.service")

# The largest request body: a course's roster (roster_handlers.MAX_CSV characters, JSON-escaped) is the largest.
MAX_BODY = 512 * 1024
STATIC = Path(__file__).parent / "static"


def make_app(
    fleet: Fleet | None,
    hub: HubClient | None = None,
    prefix: str = "/services/workbench/",
    hub_prefix: str = "/hub/",
    backend: str = "",
) -> web.Application:
    """The service's routes; ``backend`` (the hub passes ``--backend``) adds that backend's own routes.

    Every answer gets the security headers (``headers.SecurityHeaders``, a transform: pages, API, errors, the
    OAuth callback, static files, 404s); every log line names a request with its secrets scrubbed
    (``access_log``); the pages' scripts are files under ``static/`` (the CSP runs no inline script).
    """
    prefix = "/" + prefix.strip("/") + "/"
    extension = extension_of(backend)
    name = r"([^/]+)"
    # The course routes name their two parameters as the document does ({course}, {user}).
    course, student = r"(?P<course>[^/]+)", r"(?P<user>[^/]+)"
    routes = [
        (prefix, pages.PageHandler),
        (prefix + "me", pages.MyPageHandler),
        (prefix + "courses", CourseListPageHandler),
        (prefix + "courses/" + course, CoursePageHandler),
        (prefix + "oauth_callback", h.OAuthCallbackHandler),
        (prefix + "static/(.*)", pages.StaticHandler, {"path": str(STATIC)}),
        (prefix + "api/me", MyGPUsHandler),
        (prefix + "api/gpus", h.GPUsHandler),
        (prefix + "api/allocations", h.AllocationsHandler),
        (prefix + "api/quotas", h.QuotaListHandler),
        (prefix + "api/quotas/users/" + name, h.QuotaHandler),
        (prefix + "api/quotas/groups/" + name, h.GroupQuotaHandler),
        (prefix + "api/usage", UsageHandler),
        (prefix + "api/courses", ch.CourseListHandler),
        (prefix + "api/courses/" + course, ch.CourseHandler),
        (prefix + "api/courses/" + course + "/students", ch.CourseStudentsHandler),
        (prefix + "api/courses/" + course + "/roster", CourseRosterHandler),
        (prefix + "api/courses/" + course + "/reservations", csh.CourseReservationsHandler),
        (prefix + "api/courses/" + course + "/reservations/" + r"(?P<rid>[^/]+)", csh.CourseReservationHandler),
        (prefix + "api/courses/" + course + "/idle-exemption", csh.CourseIdleExemptionHandler),
        (prefix + "api/courses/" + course + "/students/" + student + "/quota", ch.StudentQuotaHandler),
        (prefix + "api/courses/" + course + "/students/" + student + "/stop", ch.StudentStopHandler),
        (prefix + "api/reservations", rh.ReservationListHandler),
        (prefix + "api/reservations/" + name, rh.ReservationHandler),
        (prefix + "api/openapi.json", h.OpenAPIHandler),
        (prefix + "metrics", h.MetricsHandler),
        *idle_routes(prefix),
        *drain_routes(prefix),
        *(extension.service_routes(prefix) if extension else []),
        (prefix + "api/.*", h.NotFoundHandler),
    ]
    # The API document (api/openapi.json; request bodies are checked against it): openapi.yaml + the backend's part.
    openapi = load_document([load_fragment(path) for path in openapi_fragments([backend])])
    app = web.Application(
        routes,
        fleet=fleet,
        hub=hub,
        stopper=None,  # serve() sets the service's one Stopper
        prefix=prefix,
        hub_prefix=hub_prefix,
        openapi=openapi,
        backends=(backend,) if extension else (),
        cookie_secret=os.urandom(32),
        xsrf_cookies=False,
        # HubOAuth's _xsrf cookie (the token the pages send back): sent on the service's own requests only.
        xsrf_cookie_kwargs={"samesite": "Lax"},
        default_handler_class=pages.NotFoundPageHandler,
        log_function=log_request,
    )
    app.add_transform(SecurityHeaders)
    hide_oauth_state()
    return app


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m workbench_hub.service",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    service_url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
    parser.add_argument("--ip", default=service_url.hostname or "127.0.0.1")
    parser.add_argument("--port", type=int, default=service_url.port or 10101)
    parser.add_argument(
        "--db-url",
        default=os.environ.get("WORKBENCH_DB_URL", ""),
        help="SQLAlchemy URL of the GPU database the hub uses (default: $WORKBENCH_DB_URL, which the hub config "
        "sets in the service's environment: a command line is readable by every account on the host)",
    )
    parser.add_argument(
        "--backend",
        default="",
        help="the hub's backend (workbench.backends entry point name), whose routes the service "
        "adds (the hub config passes it)",
    )
    parser.add_argument(
        "--session-check-seconds",
        type=float,
        default=float(os.environ.get("WORKBENCH_SESSION_CHECK_SECONDS", "60")),
        help="how often to warn servers near their session limit and stop the ones past it, and stop what an "
        "ended course's quota kept running (0: never)",
    )
    parser.add_argument(
        "--idle-check-seconds",
        type=float,
        default=float(os.environ.get("WORKBENCH_GPU_IDLE_CHECK_SECONDS", "30")),
        help="how often to read GPU utilization, warn and stop idle servers, and deliver notices (0: never)",
    )
    parser.add_argument(
        "--proxy-url",
        default=os.environ.get("JUPYTERHUB_PUBLIC_URL") or "http://127.0.0.1:8000",
        help="the proxy's address as this machine reaches it: how user servers are reached",
    )
    parser.add_argument(
        "--reservation-check-seconds",
        type=float,
        default=float(os.environ.get("WORKBENCH_RESERVATION_CHECK_SECONDS", "15")),
        help="how often to warn and stop non-members' servers for reservations that say preempt, and to stop "
        "the servers of drains given a countdown (0: never)",
    )
    parser.add_argument(
        "--save-wait-seconds",
        type=float,
        default=float(os.environ.get("WORKBENCH_SAVE_WAIT_SECONDS", "20")),
        help="how long a stop for the hub's own reasons (idle reclaim, session limit, preemption) waits for the "
        "user's open notebooks to be saved before stopping the server anyway (0: no save round)",
    )
    args = parser.parse_args(argv)
    if not args.db_url:
        parser.error("the GPU database is not known: set WORKBENCH_DB_URL or pass --db-url")
    return args


async def serve(args: argparse.Namespace, parent: int, early: Sequence[str] = ()) -> int:
    lifetime = Lifetime(parent, early)
    try:
        store = AllocationStore(args.db_url)
    except UnusableDatabaseError as exc:
        # A database from a newer release, one that cannot be migrated or opened: the hub's words (finish.fail).
        print(f"\nGPU Workbench: {exc}\n", file=sys.stderr, flush=True)
        return 2
    except Exception as exc:  # noqa: BLE001 - boundary: any failure to open the database ends the service with one line
        log.error("cannot open the GPU database %s: %s", args.db_url.split("@")[-1], exc)
        return 1
    fleet = Fleet(store)
    hub = HubClient(
        os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api"),
        os.environ.get("JUPYTERHUB_API_TOKEN", ""),
    )
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/workbench/")
    hub_prefix = os.environ.get("JUPYTERHUB_BASE_URL", "/").rstrip("/") + "/hub/"
    try:
        app = make_app(fleet, hub, prefix, hub_prefix, args.backend)
        server = listen(
            app,
            args.port,
            args.ip,
            max_body_size=MAX_BODY,
            xheaders=True,
        )
    except CannotListenError as exc:
        log.error("%s", exc)
        store.dispose()
        return 1
    settings = await asyncio.to_thread(fleet.refresh)
    if settings is None:
        log.warning(
            "Workbench service at http://%s:%s%s: waiting for the hub to publish its GPU settings "
            "(answering 503 until then)",
            args.ip,
            args.port,
            prefix,
        )
    else:
        log.info(
            "Workbench service at http://%s:%s%s (node %s, %s GPUs, %s)",
            args.ip,
            args.port,
            prefix,
            settings.node,
            len(settings.inventory.devices),
            settings.inventory.source,
        )

    # One way to stop a server for the hub's reasons (stopping.py), shared by the loops below.
    servers = UserServers(args.proxy_url, hub.token)
    stopper = make_stopper(fleet, hub, servers, args.save_wait_seconds)
    app.settings["stopper"] = stopper  # a course's staff stop a student's server through it too
    checker = None
    if args.session_check_seconds > 0:

        async def check_sessions():
            while True:
                await asyncio.sleep(args.session_check_seconds)
                try:
                    # Warned the idle rule's lead before the limit (WORKBENCH_GPU_IDLE_WARN_MINUTES, 10).
                    warn = await asyncio.to_thread(lambda: fleet.settings.gpu_idle_warn_minutes)
                    await stop_overlong_servers(fleet.book, hub, stopper, lead=timedelta(minutes=warn))
                except Exception as exc:  # noqa: BLE001 - loop boundary: the next check tries again
                    log.warning("Session limit check failed: %s", exc)
                try:
                    # A course whose end date passed: what its quota kept running stops (course_ends.py).
                    await stop_ended_courses(fleet, hub, stopper)
                except Exception as exc:  # noqa: BLE001 - loop boundary: the next check tries again
                    log.warning("Course end check failed: %s", exc)

        checker = asyncio.create_task(check_sessions())
    reclaimer = None
    if args.idle_check_seconds > 0:
        reclaimer = asyncio.create_task(make_reclaimer(fleet, hub, args, servers, stopper).run_forever())
    preemption = None
    if args.reservation_check_seconds > 0:
        from .reservation_enforcer import Preemption

        preemption = asyncio.create_task(Preemption(fleet, hub, stopper).run_forever(args.reservation_check_seconds))
        # Drains with a countdown (PUT api/drains/{gpu} with stop_servers_in_minutes) on the same pace.
        drains = asyncio.create_task(DrainStops(fleet, hub, stopper).run_forever(args.reservation_check_seconds))
    reason = await lifetime.wait()
    if preemption is not None:
        preemption.cancel()
        drains.cancel()
    log.info("Workbench service stopping: %s", reason)
    if checker is not None:
        checker.cancel()
    if reclaimer is not None:
        reclaimer.cancel()
    server.stop()
    store.dispose()
    return 0


def main(argv: list[str] | None = None, early: Sequence[str] = ()) -> int:
    parent = os.getppid()  # first: the hub may die while the service is still starting
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="[%(levelname)1.1s %(asctime)s workbench-service] %(message)s"
    )
    try:
        return asyncio.run(serve(args, parent, early))
    except KeyboardInterrupt:  # a Ctrl-C before the signal handlers were in place
        log.info("Workbench service stopping: SIGINT")
        return 0
