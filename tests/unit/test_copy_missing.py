"""Starter notebooks reach a home once, never overwrite edits, and leave droppings behind."""

from workbench_spawner.backends.local.spawner import copy_missing


def test_copies_what_is_missing_and_nothing_else(tmp_path):
    source, home = tmp_path / "notebooks", tmp_path / "home" / "notebooks"
    (source / "__pycache__").mkdir(parents=True)
    (source / ".ipynb_checkpoints").mkdir()
    (source / "00-check.ipynb").write_text("new")
    (source / "workbench_timing.py").write_text("helper")
    (source / "__pycache__" / "workbench_timing.cpython-311.pyc").write_bytes(b"\0")
    (source / ".ipynb_checkpoints" / "00-check-checkpoint.ipynb").write_text("old")
    home.mkdir(parents=True)
    (home / "00-check.ipynb").write_text("edited by the student")
    copied = copy_missing(source, home)
    assert [p.name for p in copied] == ["workbench_timing.py"]
    assert (home / "00-check.ipynb").read_text() == "edited by the student"
    assert sorted(p.name for p in home.iterdir()) == ["00-check.ipynb", "workbench_timing.py"]
