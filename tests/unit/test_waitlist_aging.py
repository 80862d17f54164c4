"""Fair share's aging bound through the real WaitList, with its injectable clock.

The queue timeout (300 s by default) is far shorter than the aging bound (30 min): a heavy user is
refused long before their request ages. The wait list remembers when a user and server first began
asking, across refusals and retries, so the bound still takes effect and nobody starves.
"""

from __future__ import annotations

import asyncio

import pytest

from workbench_spawner.placement.waitlist import WaitList, WaitTimeoutError


class Clock:
    """The wait list's clock in seconds, moved by the test."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Line:
    """A WaitList over a pool of free GPUs, with one request per user."""

    def __init__(self, mode: str = "fair-share", aging_minutes: float = 30, **kwargs) -> None:
        self.clock = Clock()
        # Real-time re-checks are short so that waiters see the test clock move at once.
        self.wl: WaitList[str] = WaitList(
            recheck_interval=0.01, mode=mode, aging_minutes=aging_minutes, clock=self.clock, **kwargs
        )
        self.free = 0
        self.served: list[str] = []
        self.reasons: dict[str, list[str]] = {}

    async def ask(self, user: str, hours: float, timeout: float = 300) -> asyncio.Task:
        """Join the line now (on the test clock) and return the waiting task."""

        async def take() -> str | None:
            if self.free:
                self.free -= 1
                self.served.append(user)
                return user
            return None

        def report(ahead: int, why: str = "") -> None:
            self.reasons.setdefault(user, []).append(why)

        async def one() -> str:
            try:
                return await self.wl.wait_for(f"{user}/", 1, take, timeout, report, user=user, gpu_hours=hours)
            except WaitTimeoutError:
                return "refused"

        task = asyncio.create_task(one())
        await asyncio.sleep(0.05)  # it joins before the test moves the clock
        return task

    async def at(self, seconds: float) -> None:
        self.clock.t = seconds
        await asyncio.sleep(0.2)  # every waiter looks at least once (idle re-check: 0.1 s)

    def order(self) -> list[str]:
        return [t.user for t in self.wl.waiting()]

    async def release(self) -> None:
        self.free += 1
        self.wl.notify()
        await asyncio.sleep(0.2)


async def keep_asking(
    line: Line, user: str, hours: float, times: list[float], last_timeout: float = 300
) -> asyncio.Task:
    """Ask at each of ``times`` (the test clock must be there), refused each time but the last."""
    task = None
    for i, t in enumerate(times):
        if task is not None:
            await line.at(times[i - 1] + 300)  # the queue timeout refuses it then
            assert await asyncio.wait_for(task, 2) == "refused"
        await line.at(t)
        task = await line.ask(user, hours, timeout=last_timeout if i == len(times) - 1 else 300)
    assert task is not None
    return task


async def test_a_heavy_user_who_keeps_asking_ages_across_refusals_and_goes_first():
    line = Line()
    # heavy first asks at 0 and is refused every 300 s (the queue timeout); retries 100 s later each time.
    heavy = await keep_asking(line, "heavy", 50.0, [0, 400, 800, 1200, 1600])
    await line.at(1700)
    light = await line.ask("light", 0.0)
    await line.at(1799)
    assert line.order() == ["light", "heavy"], "not aged yet: fewer GPU-hours first"
    await line.at(1800)
    assert line.order() == ["heavy", "light"], "30 minutes since heavy first asked: aged, goes first"
    assert line.wl.why(line.wl.waiting()[1]) == (
        "you used 0.0 GPU-hours this week; 1 request waiting longer than 30 minutes goes first"
    )
    await line.release()
    assert await asyncio.wait_for(heavy, 2) == "heavy"
    assert not light.done()
    assert "you have waited over 30 minutes" in line.reasons["heavy"][-1]
    await line.release()
    assert await asyncio.wait_for(light, 2) == "light"


async def test_without_retries_inside_the_rejoin_time_a_request_starts_again():
    line = Line(rejoin_minutes=15)
    # Refused at 300, back only 15 min and 1 s later: a new request, not an old one.
    heavy = await keep_asking(line, "heavy", 50.0, [0, 300 + 15 * 60 + 1], last_timeout=1000)
    await line.at(1300)
    light = await line.ask("light", 0.0, timeout=1000)
    await line.at(1800)  # 30 minutes after heavy's first ask, but only 10 after its current one
    assert line.order() == ["light", "heavy"]
    for task in (heavy, light):
        task.cancel()
    await asyncio.gather(heavy, light, return_exceptions=True)


async def test_being_served_forgets_the_first_arrival():
    line = Line()
    first = await keep_asking(line, "heavy", 50.0, [0, 400])
    await line.release()
    assert await asyncio.wait_for(first, 2) == "heavy"
    again = await keep_asking(line, "heavy", 50.0, [2000])
    light = await line.ask("light", 0.0)
    await line.at(2100)
    assert line.order() == ["light", "heavy"], "a new request after being served is not aged"
    for task in (again, light):
        task.cancel()
    await asyncio.gather(again, light, return_exceptions=True)


@pytest.mark.parametrize(("mode", "expect"), [("fifo", ["heavy", "light"]), ("fair-share", ["light", "heavy"])])
async def test_a_retry_keeps_its_place_in_fifo_and_its_age_in_fair_share(mode, expect):
    line = Line(mode=mode)
    heavy = await line.ask("heavy", 50.0)
    await line.at(200)
    light = await line.ask("light", 0.0, timeout=1000)  # first asked after heavy
    await line.at(300)
    assert await asyncio.wait_for(heavy, 2) == "refused"
    await line.at(400)
    heavy = await line.ask("heavy", 50.0)  # back 100 s after the refusal: still first asked at 0
    await line.at(500)
    assert line.order() == expect
    for task in (heavy, light):
        task.cancel()
    await asyncio.gather(heavy, light, return_exceptions=True)


async def test_the_queue_timeout_is_counted_on_the_wait_list_s_clock():
    line = Line()
    task = await line.ask("alice", 0.0, timeout=300)
    await line.at(299)
    assert not task.done()
    await line.at(300)
    assert await asyncio.wait_for(task, 2) == "refused"


async def test_a_bound_reached_between_two_floats_does_not_wake_the_line_forever():
    """joined + aging can round to "now" while now - joined is still under the bound: the line must
    still expect its next change after now, or every look recomputes the order and wakes everyone."""
    joined = 7887.233511355132
    now = joined + 1800.0
    assert now - joined < 1800.0  # the rounding this test is about
    line = Line()
    line.clock.t = joined
    task = await line.ask("alice", 0.0, timeout=10_000)
    line.clock.t = now
    first = line.wl._current()
    assert first.valid_until > now
    assert line.wl._current() is first, "a second look at the same instant reuses the line"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
