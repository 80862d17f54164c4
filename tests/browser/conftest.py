"""The browser tests run in tests/lanes.py's engines lane, beside the engine tests, which wait mostly on their
clusters: these few minutes balance the three lanes on CI's two cores."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.second_lane)
