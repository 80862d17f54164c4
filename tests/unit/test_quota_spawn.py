"""Quotas enforced at spawn: the mixin's checks over a fake backend."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from jupyterhub.spawner import SpawnException

from tests.unit.fake_backends import FakeHostSpawner
from workbench_spawner.ledger.store import UsageRow, utcnow
from workbench_spawner.policy.gpu_policy import _policies
from workbench_spawner.rules.quota import Quota


class QuotaSpawner(FakeHostSpawner):
    """The contract's reference host backend (tests/unit/fake_backends.py)."""


@pytest.fixture
def make_spawner(db_url):
    _policies.clear()

    def make(user="alice", name="", groups=(), **traits):
        traits = {
            "gpu_db_url": db_url,
            "simulated_gpus": "2xH100-80GB,2xA100-40GB",
        } | traits
        user_obj = SimpleNamespace(
            name=user, url=f"/user/{user}/", escaped_name=user, groups=[SimpleNamespace(name=g) for g in groups]
        )
        hub = SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/")
        return QuotaSpawner(user=user_obj, hub=hub, orm_spawner=SimpleNamespace(name=name, server=None), **traits)

    yield make
    _policies.clear()


async def refused(spawner, options) -> str:
    with pytest.raises(SpawnException) as info:
        await spawner._apply_gpu_options(options)
    assert info.value.status_code == 403
    return str(info.value)


async def test_quota_zero_refuses_gpus_but_allows_cpu(make_spawner):
    spawner = make_spawner(quota_contact="the course staff")
    spawner.gpu_quota_book.set("user", "alice", Quota(0))
    message = await refused(spawner, {"gpus": 1})
    assert "your own GPU quota allows 0 at once" in message
    assert "ask the course staff" in message
    await spawner._apply_gpu_options({"gpus": 0})
    assert spawner.gpu_request.gpus == 0
    # Without a gpus option the default is lowered to what the quota allows.
    await spawner._apply_gpu_options({})
    assert spawner.gpu_request.gpus == 0


async def test_cpu_servers_can_be_forbidden(make_spawner):
    spawner = make_spawner(cpu_servers_allowed=False)
    assert "CPU-only servers are switched off" in await refused(spawner, {"gpus": 0})


async def test_the_most_generous_group_quota_applies(make_spawner):
    spawner = make_spawner(groups=["intro", "ml-course"])
    spawner.gpu_quota_book.set("group", "intro", Quota(1))
    spawner.gpu_quota_book.set("group", "ml-course", Quota(3))
    ctx = spawner.gpu_admission_context()
    assert (ctx.quota.quota.max_gpus, ctx.quota.describe) == (3, "the GPU quota of group ml-course")
    await spawner._apply_gpu_options({"gpus": 3})
    assert spawner.gpu_request.gpus == 3
    assert "the GPU quota of group ml-course allows 3 at once" in await refused(spawner, {"gpus": 4})


async def test_exhausted_gpu_hours_budget_is_refused(make_spawner):
    spawner = make_spawner()
    spawner.gpu_quota_book.set("user", "alice", Quota(2, gpu_hours_per_week=1.0))
    store = spawner.gpu_policy.store
    with store.writes().begin() as session:
        now = utcnow()
        session.add(
            UsageRow(
                gpu_uuid="GPU-sim-00-h100-80gb",
                user="alice",
                server="",
                started=now - timedelta(hours=3),
                ended=now - timedelta(hours=1),
                reason="stopped",
            )
        )
    message = await refused(spawner, {"gpus": 1})
    assert "allows 1 GPU-hours per week" in message
    assert "used 2.0" in message
    assert spawner.gpu_admission_context().allowed_now() == 0
    await spawner._apply_gpu_options({"gpus": 0})  # CPU stays allowed


async def test_allowed_models(make_spawner):
    spawner = make_spawner()
    spawner.gpu_quota_book.set("user", "alice", Quota(1, allowed_models=("A100-40GB",)))
    message = await refused(spawner, {"gpus": 1, "gpu_model": "H100-80GB"})
    assert "allows only these GPU models: A100-40GB" in message
    # No model asked: only allowed models are handed out.
    await spawner._apply_gpu_options({"gpus": 1})
    assert spawner.gpu_request.gpu_model == "A100-40GB"
    spawner.gpu_quota_book.set("user", "alice", Quota(1, allowed_models=()))
    assert "GPU models this hub does not have" in await refused(spawner, {"gpus": 1})


async def test_session_limit_is_recorded_at_spawn_and_kept_when_the_quota_changes(make_spawner):
    spawner = make_spawner()
    book = spawner.gpu_quota_book
    book.set("user", "alice", Quota(1, max_session_hours=2.0))
    await spawner._apply_gpu_options({"gpus": 1})
    book.set("user", "alice", Quota(1, max_session_hours=0.5))
    assert book.session_limits() == {("alice", ""): 2.0}


async def test_a_quota_change_never_touches_a_running_server(make_spawner):
    spawner = make_spawner()
    await spawner._apply_gpu_options({"gpus": 1})
    await spawner.start()
    spawner.gpu_quota_book.set("user", "alice", Quota(0))
    assert len(spawner.gpu_policy.store.lease_of("alice", "").gpu_uuids) == 1
    other = make_spawner(name="second")
    assert "allows 0 at once" in await refused(other, {"gpus": 1})


async def test_the_form_shows_quota_held_and_free(make_spawner):
    spawner = make_spawner()
    spawner.gpu_quota_book.set("user", "alice", Quota(2, gpu_hours_per_week=10, allowed_models=("H100-80GB",)))
    html = await spawner._render_options_form()
    assert 'id="workbench-quota">2<' in html
    assert "You hold 0 GPUs now" in html
    assert "4 of 4 GPUs free now" in html
    assert "GPU-hours in the last 7 days: 0.0 of 10" in html
    assert "Allowed GPU models: H100-80GB" in html
    assert "your own GPU quota" in html
