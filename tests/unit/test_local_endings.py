"""The local backend says only what it knows of how a server's process ended.

A process the hub process started is its child: its poll reads the exit code (a SIGKILL is -9). A server
the hub re-attached to after a restart is not: no exit code can be read for it, and JupyterHub's poll
answers 0 ("unknown", ``Spawner.poll``). That 0 was told as "This server exited on its own (exit code 0)";
here the student and the ledger hear that the code is unknown. The reconciler, which may look first,
says what the poll would: it reads a dead child's code without reaping it (the poll still reads it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

from workbench_spawner.backends.local.spawner import LocalGPUSpawner, exit_status
from workbench_spawner.ledger.notices import NoticeBook

GPU = "GPU-sim-00-h100-80gb"
REATTACHED = "This server's process ended. The hub re-attached to it after a restart, so its exit code is unknown."


def told(spawner: LocalGPUSpawner) -> tuple[list[str], str | None]:
    """The ledger's reasons for ``spawner``'s user and the stop box's sentence."""
    store = spawner.gpu_policy.store
    notice = NoticeBook(store).last_done(spawner.user.name, "")
    return [row.reason for row in store.usage(user=spawner.user.name)], notice.message if notice else None


async def until(check, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not settled in time"
        await asyncio.sleep(0.02)


async def test_a_server_this_hub_started_and_that_was_killed_is_told_with_its_signal(local_spawner):
    spawner = local_spawner("ann")
    policy = spawner.gpu_policy
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    spawner.proc, spawner.pid, spawner.gpu_uuids, spawner._gpu_running = proc, proc.pid, [GPU], True  # as start()
    assert policy.store.adopt("ann", "", [GPU], f"pid:{proc.pid}")
    (lease,) = policy.store.leases()
    os.kill(proc.pid, signal.SIGKILL)
    await until(lambda: exit_status(proc.pid) is not None)
    killed = "This server exited on its own (killed by SIGKILL, exit code -9)."
    # The reconciler looking now sees it gone and reads its code, leaving it for the poll to reap.
    assert spawner.gpu_lease_alive(lease) is False
    assert spawner.gpu_lease_gone_reason(lease).message == killed
    assert await spawner.poll() == -9
    assert told(spawner) == (["server exited: killed by SIGKILL, exit code -9"], killed)
    assert exit_status(proc.pid) is None  # reaped by the poll
    assert policy.store.leases() == []
    # Were its lease still open now, the reconciler would not call it a server from before a restart.
    assert spawner.gpu_lease_gone_reason(lease).message == "This server exited on its own."


async def test_a_server_reattached_after_a_restart_that_ended_has_no_exit_code(local_spawner):
    # A process this hub process did not start and that is gone now (started and ended elsewhere).
    gone = subprocess.Popen(["true"])
    gone.wait()
    spawner = local_spawner("ann")
    policy = spawner.gpu_policy
    assert policy.store.adopt("ann", "", [GPU], f"pid:{gone.pid}")
    (lease,) = policy.store.leases()
    spawner.orm_spawner.server = object()  # JupyterHub kept its server row: it ran before the restart
    spawner.load_state({"pid": gone.pid, "gpu_uuids": [GPU]})  # what the hub does after its restart
    assert spawner.proc is None
    # JupyterHub's poll has no process handle: 0, its "unknown", which is not told as an exit code.
    assert await spawner.poll() == 0
    assert told(spawner) == (["server exited: exit code unknown"], REATTACHED)
    assert policy.store.leases() == []
    # The reconciler, had it looked first, says the same.
    assert spawner.gpu_lease_alive(lease) is False
    assert spawner.gpu_lease_gone_reason(lease).message == REATTACHED


def test_the_exit_code_of_an_ended_child_is_read_and_left_for_its_poll():
    exits = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert exit_status(running.pid) is None  # alive
        assert exit_status(os.getppid()) is None  # not a child of this process: only its parent reads its code
        deadline = time.monotonic() + 10
        while exit_status(exits.pid) is None:
            assert time.monotonic() < deadline, "the child did not end"
            time.sleep(0.02)
        assert exit_status(exits.pid) == 3  # read twice: not reaped
        assert exits.wait(5) == 3  # and its Popen reads it too
        assert exit_status(exits.pid) is None  # reaped: gone
    finally:
        running.kill()
        running.wait()
