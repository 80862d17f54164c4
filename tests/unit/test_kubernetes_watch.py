"""The kept watch (backends/kubernetes/watch.py) without a cluster: a reflector that gave up is restarted in place.

A stand-in for KubeSpawner's ``ResourceReflector`` with the members ``KeptWatch`` uses (``on_failure``,
``start()``, ``stop()``, ``watch_task``, ``first_load_future``, ``api``); tests/kubernetes runs the real one
against an API server that goes away.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from workbench_spawner.backends.kubernetes import watch
from workbench_spawner.backends.kubernetes.watch import KeptWatch, kept


class Reflector:
    """What KeptWatch reads of KubeSpawner's reflector; its probe answers as ``answers`` says, in turn."""

    kind = "pods"

    def __init__(self, *, on_failure=None, answers=()):
        self.on_failure = on_failure
        self._stopping = False
        self.watch_task: asyncio.Task | None = None
        self.first_load_future = asyncio.get_running_loop().create_future()
        self.log = logging.getLogger("test")
        self.api = SimpleNamespace(get_api_resources=self.probe)
        self.answers = list(answers)
        self.starts = 0

    async def probe(self, _request_timeout: float) -> None:
        if not self.answers.pop(0):
            raise OSError("connection refused")

    async def start(self) -> None:
        self.starts += 1
        self.watch_task = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
        if not self.first_load_future.done():
            self.first_load_future.set_result(None)

    async def stop(self) -> None:
        if self.watch_task is not None:
            self.watch_task.cancel()


def test_kept_puts_the_keeper_in_front_once():
    kept_class = kept(Reflector)
    assert kept(Reflector) is kept_class
    assert kept(kept_class) is kept_class
    assert kept_class.__mro__[1:3] == (KeptWatch, Reflector)


async def test_a_watch_that_gave_up_is_restarted_in_place_once_the_api_server_answers(monkeypatch):
    monkeypatch.setattr(watch, "MIN_ATTEMPT_GAP", 0.0)
    reflector = kept(Reflector)(answers=[False, True])
    recovered = []
    reflector.on_recovered = lambda: recovered.append(True)

    reflector.on_failure()  # KubeSpawner's watch loop gave up
    assert reflector.gave_up_at is not None
    await reflector.kick(wait=0.2)  # the probe is refused: not yet, the last view stays
    assert (reflector.starts, reflector.watching, reflector.loaded, recovered) == (0, False, False, [])

    await reflector.kick(wait=2)  # it answers: listed and watched again, on the same object
    assert (reflector.starts, reflector.watching, reflector.loaded, recovered) == (1, True, True, [True])
    assert reflector.gave_up_at is None

    await reflector.stop()
    await reflector.kick()  # stopped on purpose: stays stopped
    assert reflector.starts == 1
