"""Which release of GPU Workbench this is: ``version()``, from the one place it is written, pyproject.toml.

Releases are numbered by the date they land (CalVer ``YEAR.MONTH.DAY``,
PEP 440 without leading zeros: ``2026.12.7``; a second release on one day
adds a fourth number, ``2026.12.7.1``). CHANGELOG.md says why and what each
release changed. The start banner, ``workbench --version``, the workbench
service's OpenAPI document and the GPU database (``ledger/release_book.py``,
which release migrated it, named when an older release must refuse it) all
read it here.

Read from the source tree's pyproject.toml when this package runs from a
checkout (``make run``, the tests, an editable install: the installed
metadata of an editable install keeps the version it had when it was
installed, which a ``git pull`` does not change), else from the installed
package's metadata (a wheel: the hub image, the chart's hub pod).
"""

from __future__ import annotations

import functools
import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "gpu-workbench"

# spawner/workbench_spawner/release.py -> the checkout's root, where pyproject.toml is.
_SOURCE_ROOT = Path(__file__).resolve().parents[2]


def _source_tree_version(root: Path) -> str | None:
    """The version in ``root``'s pyproject.toml, if ``root`` is a checkout of this project (else None)."""
    pyproject = root / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    found = project.get("version")
    return found if project.get("name") == DISTRIBUTION and isinstance(found, str) else None


@functools.cache
def version() -> str:
    """This release's version, e.g. ``2026.12.7``; ``unknown`` where neither source has one."""
    found = _source_tree_version(_SOURCE_ROOT)
    if found:
        return found
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
