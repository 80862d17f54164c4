"""The reconciler in a real hub (local backend): it runs every ``WORKBENCH_RECONCILE_SECONDS`` while the hub
runs, closes the lease of a server killed outside the hub, ends a server that runs without a lease on a GPU
leased to another, logs each fix in one line and counts it on the workbench service's ``/metrics``.

The hub's own poll is set to an hour here, so what these tests see is the reconciler's doing, not poll's.
"""

from __future__ import annotations

import os
import signal
import sqlite3

import pytest

from tests.conftest import wait_until
from workbench_spawner.backends.local.spawner import pid_runs_jupyter
from workbench_spawner.ledger import reasons

pytestmark = pytest.mark.integration

ENV = {"WORKBENCH_SIMULATED_GPUS": "2", "WORKBENCH_RECONCILE_SECONDS": "2"}
ARGS = ["--Spawner.poll_interval=3600"]


def database(hub) -> sqlite3.Connection:
    return sqlite3.connect(hub.data_dir / "workbench.sqlite")


def lease_pid(hub, user: str) -> int:
    with database(hub) as db:
        (ref,) = db.execute("SELECT DISTINCT ref FROM gpu_leases WHERE user = ?", (user,)).fetchone()
    assert ref.startswith("pid:"), ref
    return int(ref[4:])


def fixes(hub) -> str:
    r = hub.service("GET", "metrics")
    assert r.status_code == 200, r.text
    return r.text


def start(hub, *users: str) -> None:
    hub.create_users(*users)
    for user in users:
        assert hub.spawn(user, gpus=1).status_code in (201, 202)
    for user in users:
        hub.wait_ready(user)


def test_a_server_killed_outside_the_hub_has_its_lease_closed_and_counted(running_hub):
    hub = running_hub(ENV, ARGS)
    start(hub, "ann")
    (gpu,) = hub.leases()["ann"]
    assert 'workbench_reconcile_fixes_total{kind="lease_closed"} 0.0' in fixes(hub)

    os.kill(lease_pid(hub, "ann"), signal.SIGKILL)  # an operator, the OOM killer: not through the hub
    # Within a pass once the lease is past the reconciler's 10 s grace for young leases.
    wait_until(lambda: "ann" not in hub.leases(), 40, "the reconciler to close the dead server's lease")
    with database(hub) as db:
        ended = [r for (r,) in db.execute("SELECT reason FROM gpu_usage WHERE user = 'ann'")]
    # The hub started the process: the reconciler reads its exit code (leaving the process for the poll to reap).
    assert ended == [f"{reasons.SERVER_EXITED}: killed by SIGKILL, exit code -9"]
    assert 'workbench_reconcile_fixes_total{kind="lease_closed"} 1.0' in fixes(hub)
    assert f"reconcile: closed the lease of ann/ on {gpu}: server exited" in hub.log()
    assert hub.server("ann") is not None, "the hub's poll (an hour) has not run: the reconciler did it"


def test_a_server_without_a_lease_on_a_gpu_leased_to_another_is_stopped(running_hub):
    hub = running_hub(ENV, ARGS)
    start(hub, "ann", "bob")
    (ann_gpu,), (bob_gpu,) = hub.leases()["ann"], hub.leases()["bob"]
    ann_pid, bob_pid = lease_pid(hub, "ann"), lease_pid(hub, "bob")

    # While the hub runs, the ledger comes to say bob's server holds ann's GPU and ann holds nothing (a
    # database restored from a backup): ann's server runs on a GPU leased to another, without a lease.
    with database(hub) as db:
        db.execute("DELETE FROM gpu_leases WHERE user = 'ann'")
        db.execute("UPDATE gpu_leases SET gpu_uuid = ? WHERE user = 'bob'", (ann_gpu,))
    wait_until(lambda: not pid_runs_jupyter(ann_pid), 30, "the reconciler to end ann's server on bob's GPU")
    assert pid_runs_jupyter(bob_pid), "bob's server and lease are kept"
    assert hub.leases() == {"bob": [ann_gpu]}, "bob's server and lease are kept"
    text = fixes(hub)
    assert 'workbench_reconcile_fixes_total{kind="server_stopped"} 1.0' in text
    assert 'workbench_reconcile_fixes_total{kind="server_adopted"} 0.0' in text
    assert (
        f"reconcile: ended server process {ann_pid} of ann/: it ran without a lease and its GPU(s) {ann_gpu} "
        "are leased to another server"
    ) in hub.log()
    assert bob_gpu not in hub.leases()["bob"]
