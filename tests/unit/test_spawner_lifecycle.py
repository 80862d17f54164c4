"""Every way a server ends gives its GPUs back: the mixin over a fake backend."""

import asyncio
from types import SimpleNamespace

import pytest
from jupyterhub.spawner import SpawnException
from sqlalchemy import text

from tests.unit.fake_backends import FakeHostSpawner, FakeRuntime, FakeWorld
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.policy.gpu_policy import _policies


class FakeGPUSpawner(FakeHostSpawner):
    """The contract's reference host backend (tests/unit/fake_backends.py), as the runtime to end servers on."""


@pytest.fixture
def make_spawner(tmp_path):
    _policies.clear()

    def make(user="alice", name="", **traits):
        traits = {"gpu_db_url": f"sqlite:///{tmp_path / 'wb.sqlite'}", "simulated_gpus": "2"} | traits
        user_obj = SimpleNamespace(name=user, url=f"/user/{user}/", escaped_name=user)
        hub = SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/")
        orm = SimpleNamespace(name=name, server=None)
        return FakeGPUSpawner(user=user_obj, hub=hub, orm_spawner=orm, **traits)

    yield make
    _policies.clear()


def held(spawner):
    return {lease.user: lease.gpu_uuids for lease in spawner.gpu_policy.store.leases()}


async def start(spawner, options):
    await spawner._apply_gpu_options(options)
    return await spawner.start()


async def test_start_pins_and_stop_releases(make_spawner):
    spawner = make_spawner()
    await start(spawner, {"gpus": 1})
    assert spawner.get_env()["WORKBENCH_GPUS"] == "GPU-sim-00-h100-80gb"
    assert spawner.get_state()["gpu_uuids"] == ["GPU-sim-00-h100-80gb"]
    assert held(spawner) == {"alice": ("GPU-sim-00-h100-80gb",)}
    await spawner.stop()
    assert held(spawner) == {}
    assert spawner.get_env()["WORKBENCH_GPUS"] == ""


async def test_failed_start_releases(make_spawner):
    spawner = make_spawner()
    spawner.behaviour = "fail"
    with pytest.raises(RuntimeError):
        await start(spawner, {"gpus": 1})
    assert held(spawner) == {}


async def test_timed_out_start_releases(make_spawner):
    spawner = make_spawner()
    spawner.behaviour = "hang"
    # JupyterHub wraps start() in asyncio.wait_for(start_timeout).
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(start(spawner, {"gpus": 1}), 0.5)
    await settled(lambda: held(spawner) == {})  # a cancelled start gives its GPUs back in the background


async def settled(check, within: float = 5.0) -> None:
    """Wait until ``check()`` holds (clean-ups of cancelled starts run in the background)."""
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not settled in time"
        await asyncio.sleep(0.02)


async def test_a_stop_while_the_start_waits_in_line_ends_the_wait(make_spawner):
    # The hub shutting down stops every active server, pending ones too, without cancelling their starts.
    holder = make_spawner(user="holder", simulated_gpus="1")
    await start(holder, {"gpus": 1})
    waiter = make_spawner(user="waiter", simulated_gpus="1")
    waiting = asyncio.ensure_future(start(waiter, {"gpus": 1}))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await waiter.stop()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await holder.stop()  # the GPU comes free: the stopped wait must not take it
    await asyncio.sleep(0.3)
    assert held(holder) == {}
    assert waiter.gpu_policy.placement.waiting() == 0


async def test_a_start_cancelled_after_its_lease_gives_it_back_as_start_cancelled(make_spawner):
    spawner = make_spawner()
    spawner.behaviour = "hang"  # leased, then the server's start hangs
    starting = asyncio.ensure_future(start(spawner, {"gpus": 1}))
    await settled(lambda: held(spawner) != {})
    starting.cancel()  # JupyterHub's DELETE of a pending spawn
    with pytest.raises(asyncio.CancelledError):
        await starting
    await settled(lambda: held(spawner) == {})
    assert [row.reason for row in spawner.gpu_policy.store.usage()] == ["start cancelled"]


async def test_poll_that_finds_the_server_dead_releases(make_spawner):
    spawner = make_spawner()
    await start(spawner, {"gpus": 1})
    spawner.alive = False  # crashed, OOM-killed, killed by hand
    assert await spawner.poll() == 0
    assert held(spawner) == {}


async def test_a_poll_that_answers_0_tells_no_exit_code(make_spawner):
    # JupyterHub's Spawner.poll: "exit status (0 if unknown)". A backend that knows better says so itself.
    spawner = make_spawner()
    await start(spawner, {"gpus": 1})
    spawner.alive = False
    assert await spawner.poll() == 0
    assert [row.reason for row in spawner.gpu_policy.store.usage()] == ["server exited"]


async def test_quota_counts_gpus_held_by_other_servers(make_spawner):
    first = make_spawner(name="one", default_max_gpus=2)
    await start(first, {"gpus": 1})
    second = make_spawner(name="two", default_max_gpus=2)
    with pytest.raises(SpawnException) as err:
        await second._apply_gpu_options({"gpus": 2})
    assert err.value.status_code == 403
    assert err.value.message == (
        "Cannot start the server: you asked for 2 GPUs, but the default quota allows 2 at once and your other "
        "server one holds 1 (H100-80GB). Stop one first, ask for fewer, or ask a hub admin to raise your GPU quota."
    )
    await second._apply_gpu_options({"gpus": 1})


async def test_waiting_spawn_reports_progress_then_times_out(make_spawner):
    holder = make_spawner("holder", default_max_gpus=2)
    await start(holder, {"gpus": 2})
    waiter = make_spawner("waiter", gpu_queue_timeout=0.5, gpu_queue_recheck_interval=0.05)
    events = []

    async def watch():
        async for event in waiter.progress():
            events.append(event["message"])

    watcher = asyncio.create_task(watch())
    with pytest.raises(SpawnException) as err:
        await start(waiter, {"gpus": 1})
    assert err.value.status_code == 503
    assert "No 1 GPU became free within 0.5 seconds" in err.value.message
    await asyncio.sleep(0.1)
    watcher.cancel()
    assert any("Waiting for 1 GPU to become free" in e for e in events), events


async def test_restored_spawner_reads_its_gpus_from_the_store(make_spawner):
    spawner = make_spawner()
    await start(spawner, {"gpus": 1})
    state = spawner.get_state()
    _policies.clear()  # a new hub process
    restored = make_spawner()
    restored.load_state(state)
    assert restored.gpu_uuids == ["GPU-sim-00-h100-80gb"]


@pytest.mark.parametrize(("server", "ran"), [(None, False), (SimpleNamespace(ip="10.0.0.7", port=8888), True)])
def test_after_a_restart_a_server_counts_as_run_only_if_the_hub_kept_its_server_row(make_spawner, server, ran):
    # KubeSpawner saves its pod's name even for a stopped server: a non-empty state is no sign that it ran.
    restored = make_spawner()
    restored.orm_spawner.server = server
    restored.load_state({"pod_name": "jupyter-alice", "namespace": "workbench"})
    assert restored._gpu_running is ran


def test_start_timeout_leaves_room_for_the_queue_and_the_start_line(make_spawner):
    # The queue timeout, then a start slot for up to http_timeout, then the backend's start.
    assert make_spawner(gpu_queue_timeout=600).http_timeout == 120
    assert make_spawner(gpu_queue_timeout=600).start_timeout == 600 + 120 + 120
    assert make_spawner(gpu_queue_timeout=600, http_timeout=300).start_timeout == 600 + 300 + 120


async def test_past_max_waiting_a_spawn_is_refused_with_how_many_wait(make_spawner):
    holder = make_spawner("holder", simulated_gpus="1", max_waiting_spawns=1)
    await start(holder, {"gpus": 1})
    first = make_spawner("first", simulated_gpus="1", max_waiting_spawns=1)
    waiting = asyncio.ensure_future(start(first, {"gpus": 1}))
    await settled(lambda: first.gpu_policy.start_line.in_line == 1)
    late = make_spawner("late", simulated_gpus="1", max_waiting_spawns=1)
    with pytest.raises(SpawnException) as err:
        await start(late, {"gpus": 1})
    assert err.value.status_code == 503
    assert "The hub is full: 1 student is already waiting for a server" in err.value.message
    await holder.stop()  # the line moves: the one in line starts, and nobody is counted as waiting
    await asyncio.wait_for(waiting, 5)
    assert first.gpu_policy.start_line.in_line == 0
    assert held(first) == {"first": ("GPU-sim-00-h100-80gb",)}


async def test_servers_start_a_few_at_a_time_and_the_next_is_told_how_many_are_ahead(make_spawner):
    # One start slot: the first server holds it until the hub has seen it answer (its spawn no longer pending).
    first = make_spawner("first", max_starting_servers=1)
    first._spawn_pending = True  # what JupyterHub's spawn handler sets while the spawn is in flight
    await start(first, {"gpus": 1})
    line = first.gpu_policy.start_line
    assert line.starting == 1
    second = make_spawner("second", max_starting_servers=1)
    second._spawn_pending = True
    events: list[str] = []

    async def watch():
        async for event in second.progress():
            events.append(event["message"])

    watcher = asyncio.create_task(watch())
    starting = asyncio.ensure_future(start(second, {"gpus": 0}))
    await settled(lambda: line.waiting_to_start == 1)
    assert not starting.done()
    assert not second.alive
    assert line.in_line == 1, "a spawn waiting for a start slot counts as waiting"
    first._spawn_pending = False  # the hub saw the first server answer
    await asyncio.wait_for(starting, 5)
    assert second.alive
    assert line.in_line == 0
    watcher.cancel()
    assert "Waiting to start: the host is starting 1 server ahead of yours" in events, events


async def test_a_failed_start_gives_its_start_slot_back_at_once(make_spawner):
    spawner = make_spawner(max_starting_servers=1)
    spawner._spawn_pending = True
    spawner.behaviour = "fail"
    with pytest.raises(RuntimeError):
        await start(spawner, {"gpus": 1})
    assert spawner.gpu_policy.start_line.starting == 0
    assert held(spawner) == {}


PROFILES = [
    {"slug": "small", "cpu_limit": 2, "mem_limit": "8G"},
    {"slug": "standard", "cpu_limit": 4, "mem_limit": "16G", "default": True},
    {"slug": "bigmem", "mem_limit": "64G"},
]


async def test_profile_sizes_the_server_and_does_not_stick(make_spawner):
    spawner = make_spawner(resource_profiles=PROFILES, cpu_limit=1.0, mem_limit="1G")
    await start(spawner, {"gpus": 0, "profile": "small"})
    env = spawner.get_env()
    assert (spawner.cpu_limit, spawner.mem_limit) == (2.0, 8 << 30)
    assert env["CPU_LIMIT"] == "2.0"
    assert env["MEM_LIMIT"] == str(8 << 30)
    assert spawner.gpu_request.profile == "small"
    await spawner.stop()
    # no profile named: the default profile, not the last one used
    await start(spawner, {"gpus": 0})
    assert (spawner.cpu_limit, spawner.mem_limit, spawner.gpu_request.profile) == (4.0, 16 << 30, "standard")
    await spawner.stop()
    # a profile that leaves the CPU out keeps the configured CPU limit
    await start(spawner, {"gpus": 0, "profile": "bigmem"})
    assert (spawner.cpu_limit, spawner.mem_limit) == (1.0, 64 << 30)


async def test_unknown_profile_is_a_400_and_holds_nothing(make_spawner):
    spawner = make_spawner(resource_profiles=PROFILES)
    with pytest.raises(SpawnException) as err:
        await spawner._apply_gpu_options({"gpus": 1, "profile": "huge"})
    assert err.value.status_code == 400
    assert "profile 'huge' is not offered here; choose one of: small, standard, bigmem" in err.value.message
    assert held(spawner) == {}


def test_bad_profile_configuration_is_a_trait_error(make_spawner):
    from traitlets import TraitError

    with pytest.raises(TraitError, match="'x' sets neither cpu_limit nor mem_limit"):
        make_spawner(resource_profiles=[{"slug": "x"}])


async def test_without_profiles_the_configured_limits_apply(make_spawner):
    spawner = make_spawner(cpu_limit=3.0)
    await start(spawner, {"gpus": 0})
    assert spawner.cpu_limit == 3.0
    assert spawner.gpu_request.profile is None
    assert "profile" not in await spawner._render_options_form()


async def test_form_offers_the_profiles_with_the_default_checked(make_spawner):
    html = await make_spawner(resource_profiles=PROFILES)._render_options_form()
    assert 'id="workbench-profiles"' in html
    assert 'value="standard" checked' in html
    assert 'value="small">' in html
    assert 'small: <span class="workbench-profile-summary">2 CPUs, 8 GiB memory</span>' in html
    assert "64 GiB memory" in html
    assert "but not enforced" in html  # FakeGPUSpawner, like the local backend, cannot hold a process to it
    FakeGPUSpawner.enforces_resource_limits = True
    try:
        assert "but not enforced" not in await make_spawner(resource_profiles=PROFILES)._render_options_form()
    finally:
        FakeGPUSpawner.enforces_resource_limits = False


async def test_no_sql_runs_on_the_event_loop(make_spawner):
    """Form, options, start, progress, poll, restore and stop query the database
    only from worker threads: a busy database must never stall the hub."""
    import threading

    from sqlalchemy import event

    spawner = make_spawner(default_max_gpus=2)
    loop_thread = threading.get_ident()
    on_loop: list[str] = []

    def check(conn, cursor, statement, *args):
        if threading.get_ident() == loop_thread:
            on_loop.append(statement)

    policy = await spawner._policy()
    for engine in {policy.store.engine, policy.store.read_engine}:
        event.listen(engine, "before_cursor_execute", check)
    await spawner._render_options_form()
    await spawner._apply_gpu_options({"gpus": 1})
    await spawner.start()
    assert any(m.startswith("Got 1 GPU: ") for m in [e["message"] async for e in spawner.progress()])
    assert await spawner.poll() is None
    spawner.load_state(spawner.get_state())  # as after a hub restart
    assert await spawner.poll() is None
    await spawner.stop()
    assert on_loop == [], on_loop
    assert held(spawner) == {}  # held() itself reads on the loop, so only after the check


async def test_a_running_server_whose_lease_row_was_lost_gets_its_gpus_back(make_spawner):
    spawner = make_spawner()
    await start(spawner, {"gpus": 1})
    state = spawner.get_state()
    with spawner.gpu_policy.store.writes().begin() as session:  # a restored, older GPU database
        session.execute(text("DELETE FROM gpu_leases"))
    _policies.clear()  # a new hub process
    restored = make_spawner()
    restored.alive = True
    restored.load_state(state)
    assert await restored.poll() is None
    assert held(restored) == {"alice": ("GPU-sim-00-h100-80gb",)}
    assert restored.get_env()["WORKBENCH_GPUS"] == "GPU-sim-00-h100-80gb"


async def test_a_running_server_whose_gpus_went_to_someone_else_is_stopped(make_spawner):
    spawner = make_spawner()
    await start(spawner, {"gpus": 1})
    state = spawner.get_state()
    store = spawner.gpu_policy.store
    store.release("alice", "", "lost")
    assert store.allocate("bob", "", 1, ["GPU-sim-00-h100-80gb"]) is not None
    _policies.clear()
    restored = make_spawner()
    restored.alive = True
    restored.load_state(state)
    assert await restored.poll() == 1
    assert restored.alive is False, "the server was stopped"
    assert held(restored) == {"bob": ("GPU-sim-00-h100-80gb",)}, "bob keeps his GPU"
    # Told as the hub's stop, not as an exit (the 1 is only JupyterHub's "not running").
    assert NoticeBook(store).last_done("alice", "").message == (
        "The hub stopped this server after a restart: its GPUs (GPU-sim-00-h100-80gb) are leased to another server now."
    )


async def test_the_reconciler_leaves_a_stopping_servers_lease_to_the_stop(make_spawner, monkeypatch):
    # The process is gone before the stop's own release runs: a pass in between must not close the lease
    # as "server gone" (the stop records who asked).
    world = FakeWorld()
    spawner = make_spawner()
    spawner.world = world
    await start(spawner, {"gpus": 1})
    policy = spawner.gpu_policy
    policy.reconcile(spawner.gpu_lease_alive, spawner.gpu_reconcile_orphans, spawner.gpu_lease_gone_reason)
    policy.reconcile_grace_seconds = 0
    ended = asyncio.Event()
    hold = asyncio.Event()
    runtime_stop = FakeRuntime.stop

    async def slow_stop(self, now=False):
        await runtime_stop(self, now)  # the server is gone out there
        ended.set()
        await hold.wait()  # ... and the stop has not released yet

    monkeypatch.setattr(FakeRuntime, "stop", slow_stop)
    stopping = asyncio.ensure_future(spawner.stop())
    await ended.wait()
    assert await asyncio.to_thread(policy.reconcile_now) == []
    hold.set()
    await stopping
    policy.stop_reconciler()
    assert [row.reason for row in policy.store.usage()] == ["stopped"]
