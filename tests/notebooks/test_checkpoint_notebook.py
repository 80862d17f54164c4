"""05-checkpoint-resume on the CPU: a stop announced during training makes it save and stop; run again, it
resumes from that checkpoint and finishes; run once more, it has nothing left to train."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

from tests.notebooks.conftest import NOTEBOOK_DIR, output_text

NAME = "05-checkpoint-resume.ipynb"
EXTENSION_DIR = Path(__file__).resolve().parents[2] / "extensions" / "gpu-monitor"
TOTAL_STEPS = 4 * 50  # EPOCHS x STEPS_PER_EPOCH in the notebook


@pytest.fixture
def user(tmp_path, monkeypatch, kernel_name):
    """A home and a Jupyter runtime dir the kernel inherits, with the monitor package importable."""
    home, runtime = tmp_path / "home", tmp_path / "runtime"
    home.mkdir()
    runtime.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(EXTENSION_DIR), os.environ.get("PYTHONPATH")])))
    return home, runtime / "workbench-notices.json", kernel_name


def announce(path: Path, stopping: bool) -> None:
    notices = [{"id": "42", "kind": "idle", "message": "Your idle GPU is reclaimed now.",
                "stop_at": datetime.now(UTC).isoformat(), "stopping": True}] if stopping else []  # fmt: skip
    path.write_text(json.dumps({"written": datetime.now(UTC).isoformat(), "notices": notices}))


def run(kernel_name, workdir: Path, before_training=None) -> str:
    nb = nbformat.read(str(NOTEBOOK_DIR / NAME), as_version=4)
    client = NotebookClient(nb, kernel_name=kernel_name, timeout=300, resources={"metadata": {"path": str(workdir)}})
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if "train" in cell.metadata.get("tags", []) and before_training:
                before_training()
            client.execute_cell(cell, index)
    return output_text(nb)


def checkpoints(home: Path) -> list[Path]:
    return sorted((home / "checkpoints" / "05-checkpoint-resume").glob("ckpt-*.pt"))


def test_a_stop_saves_a_checkpoint_and_the_next_run_resumes_from_it(user, tmp_path):
    home, notices, kernel_name = user
    announce(notices, stopping=False)

    def stop_is_announced():
        announce(notices, stopping=True)
        import time

        time.sleep(2.5)  # the kernel's watcher reads the file each second

    first = run(kernel_name, tmp_path, stop_is_announced)
    assert "No checkpoint yet" in first
    assert "watching for stops" in first
    assert "Stop announced: Your idle GPU is reclaimed now." in first
    assert "Stopped early to save" in first
    [saved] = checkpoints(home)
    state = torch.load(saved)
    assert state["reason"] == "stop announced"
    assert state["epoch"] == 0
    assert 0 < state["global_step"] < 50
    assert set(state) >= {"model", "optimizer", "epoch", "step", "global_step"}
    done_first = state["global_step"]

    announce(notices, stopping=False)  # the server is back; no stop now
    second = run(kernel_name, tmp_path)
    assert f"Resumed from {saved.name}: epoch 0, step {done_first} (stop announced)" in second
    assert f"trained {TOTAL_STEPS - done_first} steps this run" in second
    assert f"Training complete: {TOTAL_STEPS} steps over 4 epochs." in second
    newest = torch.load(checkpoints(home)[-1])
    assert (newest["epoch"], newest["global_step"]) == (4, TOTAL_STEPS)
    assert len(checkpoints(home)) == 3  # the tidy-up cell keeps the newest three

    third = run(kernel_name, tmp_path)
    assert "trained 0 steps this run" in third
    assert "Training complete" in third
