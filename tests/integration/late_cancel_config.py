"""A local config (``WORKBENCH_LOCAL_CONFIG``) that makes a DELETE's cancel land as the server's start() returns.

For tests/integration/test_cancelled_waits.py. A student cancelled a pending spawn about 30 ms after its GPU
was granted and its process launched: the DELETE's cancel of the spawn's task landed after ``start()``
returned and before JupyterHub's ``User.spawn`` resumed from its ``asyncio.wait_for``, which let the cancel
through (Python 3.11). Here that moment comes every time, in a real hub with JupyterHub's own handlers:

* the start of user ``late`` holds before launching its server process until a DELETE of the pending spawn
  arrives (``HeldLaunch``), and its server answers only seconds after it is launched (as on a loaded host),
  so the DELETE's own stop, a second after its cancel, finds the spawn still waiting unless the cancel ended it;
* the DELETE handler's ``spawner._spawn_future.cancel()`` goes to the spawn's task the moment the start's
  task is done (``CancelAsStartReturns``), after the server process was launched and the lease recorded.

Everything else is the local backend (``LocalGPUSpawner``).
"""

import asyncio
import sys

from jupyterhub.spawner import SimpleLocalProcessSpawner

from workbench_spawner.backends.local.spawner import LocalGPUSpawner

c = get_config()  # provided by JupyterHub when it loads this file

HELD = "late"
HOLDING = "late-cancel test: the start holds until a DELETE of its spawn arrives"


class HeldLaunch(SimpleLocalProcessSpawner):
    """The backend's launch (below the GPU mixin, as JupyterHub's spawner is): ``HELD``'s waits for the DELETE."""

    async def start(self):
        if self.user.name == HELD:
            self.start_task = asyncio.current_task()
            self.delete_arrived = asyncio.get_running_loop().create_future()
            self.log.info(HOLDING)
            await self.delete_arrived
            # The server answers 5 s after its launch.
            self.cmd = ["sh", "-c", 'sleep 5; exec "$0" "$@"', *self.cmd]
        return await super().start()


class CancelAsStartReturns:
    """The spawn's task as the DELETE handler reads it: its ``cancel()`` lets the held start go on and cancels
    the spawn's task once the start's task is done."""

    def __init__(self, spawner, task):
        self.spawner = spawner
        self.task = task

    def cancel(self, msg=None):
        self.spawner.start_task.add_done_callback(lambda _: self.task.cancel(msg))
        self.spawner.delete_arrived.set_result(None)
        return True

    def __getattr__(self, name):
        return getattr(self.task, name)


class LateCancelSpawner(LocalGPUSpawner, HeldLaunch):
    @property
    def _spawn_future(self):
        task = self.__dict__.get("_late_cancel_spawn_future")
        arrived = getattr(self, "delete_arrived", None)
        if (
            task is not None
            and arrived is not None
            and not arrived.done()
            and sys._getframe(1).f_code.co_name == "delete"
        ):
            return CancelAsStartReturns(self, task)  # read by UserServerAPIHandler.delete
        return task

    @_spawn_future.setter
    def _spawn_future(self, task):
        self.__dict__["_late_cancel_spawn_future"] = task


c.JupyterHub.spawner_class = LateCancelSpawner
c.Spawner.http_timeout = 180  # a busy 2-core host may take long to start the holder's server
