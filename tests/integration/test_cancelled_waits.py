"""Students who give up waiting: a class's pending spawns stopped through the hub's API, all at once.

Before the fix, with 92 in line, 17-20 DELETEs answered 500 ("pending spawn") and some of those
spawns stayed in the GPU line: when GPUs came free they started servers the hub no longer tracked,
each holding a lease. Here: 8 simulated GPUs held by 8 running servers, 100 more students waiting,
all 100 cancelled at the same moment; then the 8 stop, and nobody from the cancelled line starts.

Then the one cancel that still failed: sent as a GPU came free, just as its spawn's server process was
launched (about 30 ms after), it answered 500 ("pending spawn") a second later and the server started
anyway with its lease. Its moment is made to come every time (late_cancel_config.py).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.conftest import wait_until

pytestmark = pytest.mark.integration

HOLDERS = [f"holder{i}" for i in range(8)]
WAITERS = [f"waiter{i:03d}" for i in range(100)]


def test_a_hundred_cancelled_waits_leave_the_line_at_once_and_never_start(running_hub):
    hub = running_hub(
        {
            "WORKBENCH_SIMULATED_GPUS": "8",
            "WORKBENCH_QUEUE_TIMEOUT": "600",
            # The starting servers are jupyterhub-singleuser processes on a 2-core host: give them time.
            "WORKBENCH_CULL_IDLE_SECONDS": "0",
        }
    )
    hub.create_users(*HOLDERS, *WAITERS)
    with ThreadPoolExecutor(16) as pool:
        for r in pool.map(lambda u: hub.spawn(u, gpus=1), HOLDERS):
            assert r.status_code in (201, 202), r.text
        for user in HOLDERS:
            hub.wait_ready(user, timeout=240)
        assert sorted(hub.leases()) == sorted(HOLDERS)

        # The whole line joins; each waits for a GPU.
        for r in pool.map(lambda u: hub.spawn(u, gpus=1), WAITERS):
            assert r.status_code == 202, r.text
        wait_until(
            lambda: "99 ahead of you" in " ".join(hub.progress_messages(WAITERS[-1], until="ahead of you", timeout=5)),
            60,
            "the last student to see 99 ahead of them",
            log=hub.log,
        )

    # Everyone in line gives up at the same moment.
    with ThreadPoolExecutor(len(WAITERS)) as pool:
        answers = list(pool.map(lambda u: hub.api("DELETE", f"/users/{u}/server"), WAITERS))
    statuses = sorted({r.status_code for r in answers})
    failed = [(u, r.status_code, r.text[:200]) for u, r in zip(WAITERS, answers, strict=True) if r.status_code >= 300]
    assert not failed, f"DELETE of a pending spawn must answer 202/204, got {statuses}: {failed[:5]}"

    wait_until(lambda: all(hub.server(u) is None for u in WAITERS), 60, "every cancelled spawn to be gone", hub.log)
    assert sorted(hub.leases()) == sorted(HOLDERS), "a cancelled wait holds a lease"

    # The GPUs come free: nobody from the cancelled line may take one.
    with ThreadPoolExecutor(8) as pool:
        for r in pool.map(lambda u: hub.api("DELETE", f"/users/{u}/server"), HOLDERS):
            assert r.status_code in (202, 204), r.text
    for user in HOLDERS:
        hub.wait_stopped(user, timeout=120)
    # Longer than the line's re-check (2 s) and idle re-check (20 s): a waiter left behind would start by now.
    time.sleep(25)
    running = [u["name"] for u in hub.api("GET", "/users").json() if u.get("servers")]
    assert running == [], f"servers started for cancelled waits: {running}"
    assert hub.leases() == {}, "a lease outlived its server"
    assert hub.server_pids() == [], "a server process runs that the hub does not track"
    assert "RuntimeError" not in hub.log(), "JupyterHub called a cancelled spawn stuck ('... pending spawn')"


LATE_CANCEL_CONFIG = Path(__file__).with_name("late_cancel_config.py")


def test_a_cancel_that_lands_as_the_server_process_starts_stops_it_and_answers_2xx(running_hub):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "1", "WORKBENCH_LOCAL_CONFIG": str(LATE_CANCEL_CONFIG)})
    hub.create_users("holder", "late")
    assert hub.spawn("holder", gpus=1).status_code in (201, 202)
    hub.wait_ready("holder", timeout=180)
    assert hub.spawn("late", gpus=1).status_code == 202
    wait_until(
        lambda: "next in line" in " ".join(hub.progress_messages("late", until="next in line", timeout=5)),
        60,
        "late to wait in line for the GPU",
        log=hub.log,
    )

    # The GPU comes free: late's spawn gets it and starts (held until the DELETE arrives).
    assert hub.api("DELETE", "/users/holder/server").status_code in (202, 204)
    wait_until(lambda: "late-cancel test: the start holds" in hub.log(), 120, "late's start with its GPU", hub.log)
    assert list(hub.leases()) == ["late"]

    # The student cancels; the cancel lands as the server's start() returns, its process launched.
    r = requests.delete(
        f"{hub.url}/hub/api/users/late/server",
        headers={"Authorization": f"token {hub.user_token('late')}"},
        timeout=60,
    )
    assert r.status_code in (202, 204), f"the cancel answered {r.status_code}: {r.text[:300]}"
    assert "cancelled as its start() returned" in hub.log(), "the cancel did not land as the start returned"
    wait_until(lambda: hub.server("late") is None, 60, "late's server to be gone", hub.log)
    assert hub.leases() == {}, "the cancelled start kept its GPU"
    wait_until(lambda: hub.server_pids() == [], 30, "no server process left", hub.log)
    assert hub.stop_box("late") == "You stopped this server."
    # Past the time the server would have taken to answer: nothing started after all.
    time.sleep(8)
    assert hub.server("late") is None
    assert hub.server_pids() == []
    assert "RuntimeError" not in hub.log(), "JupyterHub called the cancelled spawn stuck ('... pending spawn')"
