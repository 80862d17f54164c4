"""Time-slicing per GPU: how many servers each device takes, from one setting, and what the form says."""

from __future__ import annotations

import pytest
from jupyterhub.spawner import SpawnException

from tests.unit.test_quota_spawn import make_spawner as make_spawner  # the fixture, for pytest to find
from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_hub.configurer import servers_per_gpu as parse_servers
from workbench_hub.env_values import ConfigError
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.policy.gpu_policy import GPUPolicy
from workbench_spawner.policy.settings import PolicySettings
from workbench_spawner.rules.quota import Quota

SPEC = "1xH200-141GB:mig=2x1g.18gb+1x3g.71gb,2xT4-16GB,1xH100-80GB"


def settings(tmp_path, default: int = 1, per_device: dict | None = None) -> PolicySettings:
    devices = parse_simulated_spec(SPEC)
    return PolicySettings(
        f"sqlite:///{tmp_path / 'wb.sqlite'}",
        DeviceInventory("simulated", devices, "test"),
        servers_per_gpu=default,
        servers_per_device=per_device or {},
        node="n",
    )


def test_a_uuid_beats_a_profile_beats_a_model_beats_the_default(tmp_path):
    s = settings(tmp_path, 2, {"T4-16GB": 4, "1g.18gb": 3, "H200-141GB": 9, "GPU-sim-02-t4-16gb": 1})
    assert s.slots() == {
        "MIG-sim-00-h200-141gb-0-1g.18gb": 3,
        "MIG-sim-00-h200-141gb-1-1g.18gb": 3,
        "MIG-sim-00-h200-141gb-2-3g.71gb": 9,  # a slice's model is its GPU's
        "GPU-sim-01-t4-16gb": 4,
        "GPU-sim-02-t4-16gb": 1,
        "GPU-sim-03-h100-80gb": 2,
    }
    again = PolicySettings.from_json(s.to_json(), s.db_url)
    assert again.slots() == s.slots(), "the service reads the same numbers the hub resolved"


def test_a_model_or_profile_is_matched_whatever_its_case(tmp_path):
    s = settings(tmp_path, 1, {"t4-16gb": 4, "1G.18GB": 3, "gpu-sim-02-T4-16GB": 2})
    slots = s.slots()
    assert (slots["GPU-sim-01-t4-16gb"], slots["MIG-sim-00-h200-141gb-0-1g.18gb"]) == (4, 3)
    assert slots["GPU-sim-02-t4-16gb"] == 2, "a UUID still wins over its model, whatever the case of either"


def test_two_keys_that_differ_only_in_case_are_refused():
    from traitlets import TraitError

    from workbench_spawner.policy.config import GPUPolicyConfig

    with pytest.raises(ConfigError, match="names 'T4-16GB' and 't4-16gb', the same GPUs whatever the case"):
        parse_servers("1,T4-16GB=4,t4-16gb=2")
    with pytest.raises(TraitError, match="names 'T4-16GB' and 't4-16gb', the same GPUs whatever the case"):
        GPUPolicyConfig(servers_per_device={"T4-16GB": 4, "t4-16gb": 2})
    with pytest.raises(ConfigError, match="names 'T4-16GB' twice: keep one"):
        parse_servers("1,T4-16GB=4,T4-16GB=2")
    with pytest.raises(TraitError):
        GPUPolicyConfig(servers_per_device={0: 2})  # a key names a model, profile or UUID


def test_a_key_that_names_nothing_here_is_said_at_start(tmp_path, caplog):
    from tests.unit.test_settings import config
    from workbench_spawner.policy.settings import publish_policy_settings

    c = config(
        tmp_path,
        "gpu-local",
        GPUSpawnerMixin={"simulated_gpus": SPEC, "servers_per_device": {"T4-16GB": 4, "T4-61GB": 2, "2g.35gb": 2}},
    )
    with caplog.at_level("WARNING", logger="workbench.policy"):
        publish_policy_settings(c)
    said = "names no GPU model, MIG profile or GPU UUID of this hub in 'T4-61GB', '2g.35gb' (it has 3 simulated GPU(s)"
    assert said in caplog.text, caplog.text
    assert "'T4-16GB'" not in caplog.text


@pytest.mark.parametrize(
    ("value", "parsed"),
    [("4", (4, {})), ("0", (1, {})), ("1,T4-16GB=4", (1, {"T4-16GB": 4})), ("2, 1g.18gb = 3 ", (2, {"1g.18gb": 3}))],
)
def test_the_setting_reads_a_default_and_the_gpus_that_differ(value, parsed):
    assert parse_servers(value) == parsed


@pytest.mark.parametrize("value", ["1,T4-16GB=0", "1,=4", "1,T4-16GB=x", "1,T4-16GB=1.5"])
def test_a_setting_that_cannot_be_read_says_how_to_write_it(value):
    with pytest.raises(ConfigError, match="for some GPUs write MODEL=N, PROFILE=N or UUID=N"):
        parse_servers(value)


async def test_only_the_time_sliced_gpus_take_several_servers(tmp_path):
    policy = GPUPolicy(settings(tmp_path, 1, {"T4-16GB": 2}), AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}"))
    got = [(await policy.place(f"u{i}", "", 1, "T4-16GB", 0.1)).gpu_uuids for i in range(4)]
    assert sorted(u for (u,) in got) == ["GPU-sim-01-t4-16gb"] * 2 + ["GPU-sim-02-t4-16gb"] * 2
    assert got[0] != got[1], "least-shared first: the second server goes to the other T4"
    await policy.place("h1", "", 1, "H100-80GB", 0.1)
    with pytest.raises(Exception, match="No 1 H100-80GB GPU became free"):
        await policy.place("h2", "", 1, "H100-80GB", 0.1)
    assert policy.shared


async def test_the_form_says_who_shares_a_gpu(make_spawner):
    alice = make_spawner(simulated_gpus="1xT4-16GB", servers_per_device={"T4-16GB": 3})
    bob = make_spawner("bob", simulated_gpus="1xT4-16GB", servers_per_device={"T4-16GB": 3})
    html = await alice._render_options_form()
    assert "free (time-sliced: up to 3 servers)" in html
    for spawner in (alice, bob):
        await spawner._apply_gpu_options({"gpus": 1})
        await spawner._acquire(spawner.gpu_request)
    assert "yours, shared with 1 other, 1 slot left" in await alice._render_options_form()
    carol = make_spawner("carol", simulated_gpus="1xT4-16GB", servers_per_device={"T4-16GB": 3})
    assert "shared with 2 others, 1 slot left" in await carol._render_options_form()


# -- a quota that forbids time-sliced GPUs (shared_gpus false) ---------------------------------------------

ALONE = "the GPU quota of group thesis allows no time-sliced GPUs"


@pytest.mark.parametrize(
    ("options", "got", "refusal"),
    [
        # T4s are shared by 2, the H100 and the 3g.71gb slice are not, the 1g.18gb slices by 3.
        ({"gpus": 1}, "GPU-sim-03-h100-80gb", None),  # any whole GPU: the one a server holds alone
        ({"gpus": 1, "gpu_model": "H100-80GB"}, "GPU-sim-03-h100-80gb", None),
        ({"gpus": 1, "gpu_profile": "3g.71gb"}, "MIG-sim-00-h200-141gb-2-3g.71gb", None),
        (
            {"gpus": 1, "gpu_model": "T4-16GB"},
            None,
            f"you asked for 1 T4-16GB GPU, but {ALONE} and every T4-16GB GPU here is time-sliced "
            "(shared by up to 2 servers)",
        ),
        (
            {"gpus": 1, "gpu_profile": "1g.18gb"},
            None,
            f"you asked for 1 1g.18gb slice, but {ALONE} and every 1g.18gb slice here is time-sliced "
            "(shared by up to 3 servers)",
        ),
        (
            {"gpus": 2},
            None,
            f"you asked for 2 GPUs, but {ALONE} and only 1 of them here is not time-sliced",
        ),
    ],
)
async def test_a_quota_without_shared_gpus_gets_only_gpus_held_alone(make_spawner, options, got, refusal):
    traits = {"simulated_gpus": SPEC, "servers_per_device": {"T4-16GB": 2, "1g.18gb": 3}}
    spawner = make_spawner(groups=("thesis",), **traits)
    spawner.gpu_quota_book.set("group", "thesis", Quota(2, shared_gpus=False))
    if refusal:
        with pytest.raises(SpawnException) as info:
            await spawner._apply_gpu_options(options)
        assert info.value.status_code == 403
        assert refusal in str(info.value)
        assert "ask a hub admin to allow time-sliced GPUs" in str(info.value)
        return
    await spawner._apply_gpu_options(options)
    assert spawner.gpu_request.exclusive
    assert (await spawner._acquire(spawner.gpu_request)).gpu_uuids == (got,)
    # Without the rule the same request may land on a shared GPU, and is not marked.
    other = make_spawner("bob", **traits)
    await other._apply_gpu_options(options)
    assert not other.gpu_request.exclusive


async def test_the_rule_holds_while_waiting_and_on_a_hub_that_shares_nothing(make_spawner):
    traits = {"simulated_gpus": "1xT4-16GB,1xH100-80GB", "servers_per_device": {"T4-16GB": 4}, "gpu_queue_timeout": 0.2}
    first = make_spawner("ann", groups=("thesis",), **traits)
    first.gpu_quota_book.set("group", "thesis", Quota(1, shared_gpus=False))
    await first._apply_gpu_options({"gpus": 1})
    assert (await first._acquire(first.gpu_request)).gpu_uuids == ("GPU-sim-01-h100-80gb",)
    second = make_spawner("ben", groups=("thesis",), **traits)
    await second._apply_gpu_options({"gpus": 1})
    with pytest.raises(SpawnException, match="No 1 GPU became free"):
        await second._acquire(second.gpu_request)  # the T4 has 3 slots free, but they are shared
    form = await second._render_options_form()
    assert "Your quota allows no time-sliced GPUs: you get a GPU (or slice) no other server shares" in form
    assert 'id="workbench-no-shared"' not in await make_spawner("dee", **traits)._render_options_form()
    plain = make_spawner("cy", groups=("thesis",), simulated_gpus="2xH100-80GB")
    await plain._apply_gpu_options({"gpus": 1})
    assert not plain.gpu_request.exclusive, "no device is time-sliced: the rule has nothing to do"
