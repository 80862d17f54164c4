"""The browser tests run in tests/lanes.py's second lane, beside the engine tests: the first lane is the
longer one (Docker, hubs, HTTPS), so these few minutes balance the two on CI's two cores."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.second_lane)
