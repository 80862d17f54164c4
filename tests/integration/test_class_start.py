"""A whole class presses Start at once: 300 students on 2 GPUs, every one gets a server or a place in line.

Before: JupyterHub's ``concurrent_spawn_limit`` (100) answered 429 "Too many users trying to log
in right now" to every spawn past the hundredth, before our GPU line saw it. Now the hub derives
JupyterHub's limit from the line's (``WORKBENCH_MAX_WAITING``, spawn_limits.py): 300 spawns on 2
simulated GPUs give 2 servers and 298 places in line, each student told a distinct place, 0 to 297
ahead; the next one past the line's limit gets a 503 that says how many wait. The 2 servers are a
stand-in (benchmarks/hub_responsiveness.py's: it answers 200 on every path): starting JupyterLabs is
not what this test is about.
"""

from __future__ import annotations

import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import REPO, wait_until

pytestmark = pytest.mark.integration

STUDENTS = [f"student{i:03d}" for i in range(300)]
# The last word names what it stands in for: the local backend knows its servers by "jupyter" in their command.
STANDIN = [
    f"--Spawner.cmd={arg}"
    for arg in (
        sys.executable,
        REPO / "benchmarks" / "hub_responsiveness.py",
        "--standin-server",
        "--for=jupyterhub-singleuser",
    )
]
AHEAD = re.compile(r"Waiting for 1 GPU: (\d+) ahead of you in line|Waiting for 1 GPU to become free \(you are next")


def place(messages: list[str]) -> int | None:
    """How many are ahead, from the newest position line of a progress stream."""
    for message in reversed(messages):
        found = AHEAD.search(message)
        if found:
            return int(found.group(1)) if found.group(1) else 0
    return None


def test_three_hundred_spawns_on_two_gpus_all_get_a_server_or_a_place(running_hub):
    hub = running_hub(
        {"WORKBENCH_SIMULATED_GPUS": "2", "WORKBENCH_QUEUE_TIMEOUT": "900", "WORKBENCH_MAX_WAITING": "298"},
        STANDIN,
    )
    assert "Class start: up to 298 spawns wait in line" in hub.log()
    hub.create_users(*STUDENTS, "late")
    with ThreadPoolExecutor(100) as pool:
        answers = list(pool.map(lambda u: hub.spawn(u, gpus=1), STUDENTS))
    codes = [r.status_code for r in answers]
    assert codes.count(429) == 0, "JupyterHub throttled spawns that should have waited in line"
    assert [c for c in codes if c >= 500] == [], [r.text[:200] for r in answers if r.status_code >= 500][:3]
    assert set(codes) <= {201, 202}, sorted(set(codes))

    for user in STUDENTS:  # two got the GPUs (the first to reach the line), the rest wait
        wait_until(lambda u=user: hub.server(u) is not None, 30, f"{user}'s spawn to be listed", hub.log)
    wait_until(
        lambda: len([u for u in STUDENTS if (hub.server(u) or {}).get("ready")]) == 2, 120, "2 servers ready", hub.log
    )
    served = [u for u in STUDENTS if (hub.server(u) or {}).get("ready")]
    assert sorted(hub.leases()) == sorted(served)

    # Every student in line is told a place: distinct, contiguous, 0 .. 297 ahead. The stream replays every
    # event since Start (the places told while the first two took their GPUs too), then sends a keep-alive
    # every 8 s: read past the first keep-alive and take the newest place, as the pending page shows it.
    waiting = [u for u in STUDENTS if u not in served]
    with ThreadPoolExecutor(100) as pool:
        places = dict(
            zip(waiting, pool.map(lambda u: place(hub.progress_messages(u, timeout=8.5)), waiting), strict=True)
        )
    assert None not in places.values(), [u for u, p in places.items() if p is None][:5]
    assert sorted(places.values()) == list(range(len(waiting))), "places are not distinct and contiguous"

    # One more than the line holds: a 503 that says how many are waiting, not a 429.
    late = hub.spawn("late", gpus=1)
    assert late.status_code == 503, late.text
    assert "The hub is full: 298 students are already waiting for a server" in late.text
    assert "pending spawns, throttling" not in hub.log()
