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
    "options, expected",
    [({}, 1), (None, 1), ({"gpus": 0}, 0), ({"gpus": "3"}, 3), ({"gpus": 2.0}, 2), ({"gpus": None}, 1)],
)
def test_valid_gpu_counts(options, expected):
    assert parse(options).gpus == expected


@pytest.mark.parametrize(
    "options, message",
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
