"""Spawn options: the form and the JSON API share one set of checks."""

import pytest

from workbench_spawner.form.options import OptionError, options_from_form, parse_options

MODELS = ["A100-40GB", "H100-80GB"]


def parse(options, **kw):
    kw = {"inventory_size": 4, "models": MODELS, "default_gpus": 1} | kw
    return parse_options(options, **kw)


def test_form_fields_become_the_same_options_as_json():
    form = {"gpus": ["2"], "gpu_model": [" h100-80gb "], "_xsrf": ["token"], "image": [""]}
    assert options_from_form(form) == {"gpus": "2", "gpu_model": "h100-80gb"}
    assert parse(options_from_form(form)) == parse({"gpus": 2, "gpu_model": "H100-80GB"})


@pytest.mark.parametrize(
    ("options", "expected"),
    [({}, 1), (None, 1), ({"gpus": 0}, 0), ({"gpus": "3"}, 3), ({"gpus": 2.0}, 2), ({"gpus": None}, 1)],
)
def test_valid_gpu_counts(options, expected):
    assert parse(options).gpus == expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gpus": -1}, "cannot be negative"),
        ({"gpus": "-2"}, "cannot be negative"),
        ({"gpus": 1.5}, "whole number of GPUs, not 1.5"),
        ({"gpus": "two"}, "not 'two'"),
        ({"gpus": True}, "not true/false"),
        ({"gpus": [1]}, "whole number"),
        ({"gpus": 5}, "asked for 5 GPUs but this hub has only 4"),
        ({"gpus": 10**30}, "this hub has only 4"),
        ({"gpu_model": "V100"}, "unknown gpu_model 'V100'; this hub has: A100-40GB, H100-80GB"),
        ({"gpu_model": 7}, "gpu_model must be a model name"),
        ({"image": "evil/image"}, "does not offer a choice of image"),
        ({"gpus": 1, "gpu": 2}, "unknown spawn option(s): 'gpu'"),
    ],
)
def test_bad_options_are_refused_with_a_reason(options, message):
    with pytest.raises(OptionError) as err:
        parse(options)
    assert message in str(err.value)


def test_cpu_only_hub_says_so():
    with pytest.raises(OptionError, match="no GPUs, so it can only start CPU servers"):
        parse({"gpus": 1}, inventory_size=0, models=[], default_gpus=0)
    assert parse({}, inventory_size=0, models=[], default_gpus=0).gpus == 0


def test_images_must_be_offered():
    offered = ["gpu-workbench/singleuser:cu126", "gpu-workbench/singleuser:cu128"]
    assert parse({"image": offered[1]}, allowed_images=offered).image == offered[1]
    with pytest.raises(OptionError, match="not offered here"):
        parse({"image": "alpine"}, allowed_images=offered)


def test_profile_must_be_offered():
    assert parse({"profile": " Large "}, profiles=["small", "large"]).profile == "large"
    assert parse({}, profiles=["small", "large"]).profile is None  # the spawner picks the default
    with pytest.raises(OptionError, match="profile 'huge' is not offered here; choose one of: small, large"):
        parse({"profile": "huge"}, profiles=["small", "large"])
    with pytest.raises(OptionError, match="does not offer a choice of resource profiles"):
        parse({"profile": "small"})
    with pytest.raises(OptionError, match="name of one of the offered resource profiles"):
        parse({"profile": 3}, profiles=["small"])


# -- MIG slices: gpu_profile ----------------------------------------------------------------

SLICES = {"1g.18gb": {"H200-141GB": 7}, "3g.40gb": {"H100-80GB": 2, "A100-80GB": 2}}


def test_a_slice_is_asked_for_by_profile_with_or_without_the_model():
    asked = parse({"gpus": 1, "gpu_profile": " 1G.18GB "}, slices=SLICES)
    assert (asked.gpus, asked.gpu_profile, asked.gpu_model, asked.kind) == (1, "1g.18gb", None, "1g.18gb")
    both = parse({"gpus": 1, "gpu_profile": "3g.40gb", "gpu_model": "a100-80gb"}, slices=SLICES)
    assert (both.gpu_model, both.kind) == ("A100-80GB", "A100-80GB 3g.40gb")
    assert parse({"gpus": 0, "gpu_profile": "1g.18gb"}, slices=SLICES).gpu_profile is None, "CPU only: no slice"
    assert parse({"gpus": 1, "gpu_model": "H100-80GB"}, slices=SLICES).kind == "H100-80GB", "whole GPUs as before"


def test_a_hub_of_slices_only_leaves_the_choice_of_profile_to_admission():
    asked = parse({"gpus": 1}, inventory_size=0, models=[], slices=SLICES)
    assert (asked.gpus, asked.gpu_profile) == (1, None)


@pytest.mark.parametrize(
    ("options", "slices", "message"),
    [
        ({"gpu_profile": "2g.35gb"}, SLICES, "no MIG slices of '2g.35gb'; it has: 1g.18gb (7 on H200-141GB), 3g.40gb"),
        ({"gpu_profile": "1g.18gb"}, {}, "this hub has no MIG slices, so gpu_profile '1g.18gb' cannot be had"),
        ({"gpu_profile": 1}, SLICES, "gpu_profile must be a MIG profile such as 1g.18gb"),
        ({"gpu_profile": " "}, SLICES, "gpu_profile must be a MIG profile"),
        # A CPU server's gpu_profile is checked as its gpu_model is: a typo is said, not ignored.
        ({"gpus": 0, "gpu_profile": "9g.1gb"}, SLICES, "this hub has no MIG slices of '9g.1gb'; it has: 1g.18gb"),
        ({"gpus": 0, "gpu_profile": 7}, SLICES, "gpu_profile must be a MIG profile such as 1g.18gb"),
        (
            {"gpu_profile": "1g.18gb", "gpu_model": "H100-80GB"},
            SLICES,
            "unknown gpu_model 'H100-80GB'; this hub has 1g.18gb slices on: H200-141GB",
        ),
    ],
)
def test_a_slice_that_is_not_there_is_refused_with_a_reason(options, slices, message):
    with pytest.raises(OptionError) as err:
        parse(options, slices=slices)
    assert message in str(err.value)


def test_a_request_matches_whole_gpus_or_slices_never_both():
    from workbench_devices import parse_simulated_spec
    from workbench_spawner.form.options import device_matches
    from workbench_spawner.rules.reservations import gpus_text as kind_text

    devices = parse_simulated_spec("1xH200-141GB:mig=2x1g.18gb+1x2g.35gb,1xH200-141GB,1xH100-80GB:mig=7x1g.10gb")
    picked = {
        kind: [d.uuid for d in devices if device_matches(d, kind)]
        for kind in (None, "H200-141GB", "1g.18gb", "H200-141GB 2g.35gb", "H100-80GB 2g.35gb", "H100-80GB")
    }
    assert picked[None] == picked["H200-141GB"] == ["GPU-sim-01-h200-141gb"]
    assert picked["1g.18gb"] == ["MIG-sim-00-h200-141gb-0-1g.18gb", "MIG-sim-00-h200-141gb-1-1g.18gb"]
    assert picked["H200-141GB 2g.35gb"] == ["MIG-sim-00-h200-141gb-2-2g.35gb"]
    assert picked["H100-80GB 2g.35gb"] == picked["H100-80GB"] == []
    assert [kind_text(1, "1g.18gb"), kind_text(2, "H200-141GB 1g.18gb"), kind_text(3, None)] == [
        "1 1g.18gb slice",
        "2 H200-141GB 1g.18gb slices",
        "3 GPUs",
    ]
