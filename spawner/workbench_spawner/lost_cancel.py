"""A cancel of a spawn that JupyterHub's wait for ``start()`` let through, given again.

JupyterHub's ``User.spawn`` (6.1) waits for ``Spawner.start()`` with
``asyncio.wait_for(f, timeout=start_timeout)``. On Python 3.11 ``wait_for``
swallows a cancel that lands after ``start()`` finished and before the
spawn's task resumed: its ``except CancelledError`` sees the start done and
returns its result. That is the moment the server's process has just been
launched, and a student's DELETE of the pending spawn (JupyterHub's handler
cancels ``spawner._spawn_future``) landing then was lost: the spawn carried
on, the DELETE's ``stop_single_user`` a second later found the spawn still
pending and answered 500 (``RuntimeError: <user> pending spawn``), and the
server started anyway with its lease. ``asyncio.timeout`` (3.11) and the
``wait_for`` of Python 3.12, built on it, do not lose the cancel.

The task still counts the cancel (``Task.cancelling()``: nothing called
``uncancel``). ``User.spawn`` calls ``Spawner.start_polling()`` in that same
task right after the wait, before it waits for the server to answer: there
``give_lost_cancel_again`` cancels the task again, the spawn ends at that
next wait, and the DELETE, after its second, stops the server (its process,
its lease) and answers 202 or 204. Where the wait lost nothing (any other
Python, no cancel) it does nothing. docs/stops.md has the upstream issue's text.
"""

from __future__ import annotations

import asyncio
import logging


def give_lost_cancel_again(label: str, log: logging.Logger | logging.LoggerAdapter) -> bool:
    """In the spawn's task, right after JupyterHub's wait for ``start()``: if the task was asked to cancel and
    carried on, cancel it again (it ends at its next wait). ``label`` names the server in the log line. True
    if it did."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop runs here: no spawn's task either
        return False
    if task is None or task.done() or not task.cancelling():
        return False
    log.warning(
        "The spawn of %s was cancelled as its start() returned, and JupyterHub's wait for start() let the "
        "cancel through: cancelling it again, so that the stop that follows ends the server",
        label,
    )
    task.cancel()
    return True
