"""Time-slicing per GPU: how many servers each device takes, from one setting, and what the form says."""

from __future__ import annotations

import pytest

from tests.unit.test_quota_spawn import make_spawner  # noqa: F401  (the fixture)
from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_hub.configurer import servers_per_gpu as parse_servers
from workbench_hub.env_values import ConfigError
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.policy.gpu_policy import GPUPolicy
from workbench_spawner.policy.settings import PolicySettings

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


async def test_the_form_says_who_shares_a_gpu(make_spawner):  # noqa: F811
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
