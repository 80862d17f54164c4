"""docs/configuration.md is generated from the traits' help (docs/generate_config_reference.py) and kept current.

A trait whose help, type or default changes without the reference being
regenerated fails here with the command to run. The house rule that every
configurable trait has a ``help=`` is checked on the same classes.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "docs" / "generate_config_reference.py"


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location("generate_config_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is made
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def documented_classes(generator) -> list[type]:
    core, backends = generator.sections()
    return [s.cls for s in core] + [s.cls for _, _, own in backends for s in own]


def test_configuration_reference_is_current(generator):
    problem = generator.check(generator.OUTPUT)
    assert not problem, problem  # "... run `python docs/generate_config_reference.py` and commit the result."


def test_every_configurable_trait_has_help(generator):
    missing = [
        f"{cls.__module__}.{cls.__name__}.{name}"
        for cls in documented_classes(generator)
        for name, trait in generator.own_config_traits(cls)
        if not (trait.help or "").strip()
    ]
    assert not missing, (
        "every configurable trait needs a help= (the house rule, and what "
        f"docs/configuration.md is made of); these have none: {', '.join(missing)}"
    )


def test_the_reference_names_every_backend_and_every_trait(generator):
    text = generator.render()
    backends = [name for name, _ in generator.spawner_entry_points()]
    assert {"gpu-local", "gpu-docker", "gpu-slurm"} <= set(backends)
    for name in backends:
        assert f"## `{name}`: " in text
    headings = re.findall(r"^#+ `c\.(\w+)\.(\w+)`$", text, flags=re.MULTILINE)
    expected = [name for cls in documented_classes(generator) for name, _ in generator.own_config_traits(cls)]
    assert sorted(name for _, name in headings) == sorted(expected)
    assert len(set(headings)) == len(headings)
    # Traits of the core are set on GPUSpawnerMixin, SlurmTraits' on the Slurm spawner.
    assert ("GPUSpawnerMixin", "gpu_queue_timeout") in headings
    assert ("SlurmGPUSpawner", "slurm_partition") in headings


def test_the_reference_holds_nothing_of_this_machine(generator, monkeypatch, tmp_path):
    # Computed defaults are described, never evaluated: another environment gives the same text.
    before = generator.render()
    monkeypatch.setenv("WORKBENCH_SIMULATED_GPUS", "2xA100-40GB")
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("WORKBENCH_SLURM_PARTITION", "elsewhere")
    monkeypatch.chdir(tmp_path)
    after = generator.render()
    assert after == before
    for value in (str(REPO), os.getcwd(), sys.prefix, str(tmp_path)):
        assert value not in after
    assert " at 0x" not in after  # no object's repr with its memory address
