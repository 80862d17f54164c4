"""The release's version: written once (pyproject.toml), a date, shown where an operator looks, in the changelog.

``workbench_spawner.release.version()`` reads the checkout's pyproject.toml
when it runs from one (an editable install's metadata keeps the version it was
installed with), else the installed package's metadata. The changelog's
newest entry is this version, the start banner and ``workbench --version``
show it, and the migrations' ``HEAD`` is the newest revision file.
"""

from __future__ import annotations

import re
import tomllib
from datetime import date
from importlib import metadata
from pathlib import Path

import pytest

from workbench_devices import DeviceInventory
from workbench_hub import banner, cli
from workbench_spawner import release
from workbench_spawner.ledger.migrations import HEAD, HERE, known_revisions

REPO = Path(__file__).resolve().parents[2]
CALVER = re.compile(r"(?P<year>20\d\d)\.(?P<month>1[0-2]|[1-9])\.(?P<day>3[01]|[12]\d|[1-9])(\.[1-9]\d*)?")


def pyproject_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_the_version_is_pyprojects_and_a_date():
    found = CALVER.fullmatch(release.version())
    assert found, release.version()
    assert release.version() == pyproject_version()
    date(int(found["year"]), int(found["month"]), int(found["day"]))  # a real day


def test_the_changelogs_newest_entry_is_this_release():
    headings = [line for line in (REPO / "CHANGELOG.md").read_text().splitlines() if line.startswith("## ")]
    found = CALVER.match(release.version())
    assert found
    landed = date(int(found["year"]), int(found["month"]), int(found["day"]))
    assert headings[0] == f"## {release.version()} ({landed.isoformat()})"


def test_an_installed_package_reads_its_metadata(monkeypatch, tmp_path):
    """Outside a checkout (a wheel in the hub image): the metadata; without either, 'unknown'."""
    monkeypatch.setattr(release, "_SOURCE_ROOT", tmp_path)
    release.version.cache_clear()
    try:
        monkeypatch.setattr(release.metadata, "version", lambda name: {"gpu-workbench": "2026.12.9"}[name])
        assert release.version() == "2026.12.9"
        release.version.cache_clear()

        def missing(name: str) -> str:
            raise metadata.PackageNotFoundError(name)

        monkeypatch.setattr(release.metadata, "version", missing)
        assert release.version() == "unknown"
    finally:
        release.version.cache_clear()


def test_another_projects_pyproject_is_not_read(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "something-else"\nversion = "9.9"\n')
    assert release._source_tree_version(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "gpu-workbench"\nversion = "2026.12.9"\n')
    assert release._source_tree_version(tmp_path) == "2026.12.9"


def test_the_banner_and_the_cli_show_it(capsys):
    from traitlets.config import Config

    c = Config()
    c.JupyterHub.bind_url = "http://127.0.0.1:8000"
    c.Authenticator.admin_users = {"admin"}
    lines = banner.banner(c, "local", Path("data"), DeviceInventory("none", [], "no driver")).splitlines()
    assert lines[3] == f"Version: {release.version()} (before an upgrade: workbench backup; docs/upgrading.md)"
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"workbench (GPU Workbench) {release.version()}\n"


def test_head_is_the_newest_migration():
    files = sorted(p.name for p in (HERE / "versions").glob("0*.py"))
    assert files[-1].startswith(f"{HEAD}_")
    assert known_revisions() == {name[:4] for name in files}
