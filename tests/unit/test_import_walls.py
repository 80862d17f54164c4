"""The walls of the architecture (docs/architecture.md), checked on the source: the one guard of them.

* The policy core (every module of ``workbench_spawner`` outside ``backends/``)
  imports no backend module.
* The workbench service (``workbench_hub/service``), the hub's config file
  and the hub's other modules import no backend module: they find backends
  through the ``workbench.backends`` entry points (``workbench_spawner.backend``).
* A backend imports no other backend.
Import statements are read with ``ast`` (lazy imports inside functions count too); a relative
import stays inside its own package, and the backends are a package of their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPAWNER = REPO / "spawner" / "workbench_spawner"
BACKENDS = SPAWNER / "backends"


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def backend_imports(path: Path, allowed: str | None = None) -> list[str]:
    return sorted(
        name
        for name in imported(path)
        if name.startswith(("workbench_spawner.backends.", "batchspawner", "dockerspawner", "kubespawner"))
        and not (allowed and name.startswith(f"workbench_spawner.backends.{allowed}"))
    )


CORE = sorted(p for p in SPAWNER.rglob("*.py") if BACKENDS not in p.parents)
HUB = sorted((REPO / "hub").rglob("*.py"))


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(SPAWNER)))
def test_the_policy_core_imports_no_backend(path):
    assert backend_imports(path) == [], f"{path.relative_to(REPO)} imports a backend"


@pytest.mark.parametrize("path", HUB, ids=lambda p: str(p.relative_to(REPO)))
def test_the_hub_config_and_the_service_import_no_backend(path):
    assert backend_imports(path) == [], f"{path.relative_to(REPO)} imports a backend: use its workbench.backends entry"


@pytest.mark.parametrize(
    "folder", sorted(p for p in BACKENDS.iterdir() if p.is_dir() and p.name != "__pycache__"), ids=lambda p: p.name
)
def test_a_backend_imports_no_other_backend(folder):
    for path in folder.rglob("*.py"):
        others = [n for n in backend_imports(path, allowed=folder.name) if n.startswith("workbench_spawner.")]
        assert others == [], f"{path.relative_to(REPO)} imports another backend"


def test_the_guard_finds_a_wall_breach(tmp_path):
    breach = tmp_path / "breach.py"
    breach.write_text("def f():\n    from workbench_spawner.backends.slurm.jobs import list_jobs\n")
    assert backend_imports(breach) == [
        "workbench_spawner.backends.slurm.jobs",
        "workbench_spawner.backends.slurm.jobs.list_jobs",
    ]
