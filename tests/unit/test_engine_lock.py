"""The lanes' lock over the one Docker Engine (tests/conftest.py ``docker_engine_use``): a dockerd restart
waits for the Kubernetes test under way, and a Kubernetes test that comes after the restart asked waits
for the restart, so the restart is never starved and never kills a pod mid-test."""

from __future__ import annotations

import threading
import time

import tests.conftest as root


def test_a_restart_waits_for_the_test_under_way_and_goes_before_the_next(tmp_path, monkeypatch):
    monkeypatch.setattr(root, "ENGINE_LOCKS", tmp_path)
    order: list[str] = []
    first_in, first_may_end = threading.Event(), threading.Event()

    def pod_test(name: str, entered: threading.Event | None = None, hold: threading.Event | None = None):
        with root.docker_engine_use(exclusive=False):
            order.append(f"{name} in")
            if entered:
                entered.set()
            if hold:
                hold.wait(5)
            order.append(f"{name} out")

    def restart():
        with root.docker_engine_use(exclusive=True):
            order.append("restart")
            time.sleep(0.2)

    first = threading.Thread(target=pod_test, args=("first", first_in, first_may_end))
    first.start()
    assert first_in.wait(5)
    restarting = threading.Thread(target=restart)
    restarting.start()
    time.sleep(0.3)  # the restart now waits on the first test, holding the gate
    second = threading.Thread(target=pod_test, args=("second",))
    second.start()
    time.sleep(0.3)
    assert order == ["first in"], "neither the restart nor the next test may start while the first runs"
    first_may_end.set()
    for thread in (first, restarting, second):
        thread.join(5)
    assert order == ["first in", "first out", "restart", "second in", "second out"]
