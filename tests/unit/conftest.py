"""Fixtures the unit tests share."""

from __future__ import annotations

import pytest

from workbench_spawner.ledger.store import AllocationStore


@pytest.fixture
def store(tmp_path):
    """A fresh GPU database (SQLite, migrated to the newest revision) for one test."""
    s = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    yield s
    s.dispose()
