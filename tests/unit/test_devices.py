"""Simulated GPU specs: stable devices from one line of configuration."""

import pytest

from workbench_devices import DeviceSpecError, discover_devices, parse_simulated_spec


def test_a_count_gives_that_many_stable_h100s():
    devices = parse_simulated_spec("4")
    assert [d.uuid for d in devices] == [f"GPU-sim-{i:02d}-h100-80gb" for i in range(4)]
    assert all(d.simulated and d.memory_total_bytes == 80 * 2**30 for d in devices)
    assert parse_simulated_spec("4") == devices, "same spec, same UUIDs"


def test_a_mixed_spec():
    devices = parse_simulated_spec("2xH100-80GB, 1xA100-40GB")
    assert [(d.index, d.model) for d in devices] == [(0, "H100-80GB"), (1, "H100-80GB"), (2, "A100-40GB")]
    assert "simulated" in devices[2].name


@pytest.mark.parametrize("spec", ["x", "2xH100-80GB,,", "-1", "1000", "0xH100-80GB", "2xH100-0GB"])
def test_bad_specs_say_what_to_write(spec):
    with pytest.raises(DeviceSpecError, match="WORKBENCH_SIMULATED_GPUS"):
        parse_simulated_spec(spec)


def test_discovery_labels_its_source():
    assert discover_devices("2").source == "simulated"
    assert "simulated" in discover_devices("2").message
    # No driver on this machine kind: no GPUs, and a sentence saying so.
    real = discover_devices(None)
    assert real.source in ("nvml", "none")
    if real.source == "none":
        assert real.devices == [] and "CPU only" in real.message
