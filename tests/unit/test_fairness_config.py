"""WORKBENCH_QUEUE_ORDER, the aging bound, the time zone and the test clock become spawner traits; bad values stop."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

import pytest
from traitlets.config import Config

from workbench_hub import configurer
from workbench_hub.configurer import ConfigError
from workbench_spawner.policy.clock import hub_clock, set_test_clock


@pytest.mark.parametrize(
    ("env", "expect"),
    [
        ({}, {"gpu_queue_order": "fifo", "gpu_queue_aging_minutes": 30.0}),
        (
            {"WORKBENCH_QUEUE_ORDER": "fair-share", "WORKBENCH_QUEUE_AGING_MINUTES": "5"},
            {"gpu_queue_order": "fair-share", "gpu_queue_aging_minutes": 5.0},
        ),
        ({"WORKBENCH_QUEUE_ORDER": "FIFO"}, {"gpu_queue_order": "fifo"}),
        ({"WORKBENCH_TIME_ZONE": "Europe/Berlin"}, {"gpu_time_zone": "Europe/Berlin"}),
        ({"WORKBENCH_TEST_CLOCK_FILE": "/tmp/clock"}, {"gpu_test_clock_file": "/tmp/clock"}),
    ],
)
def test_fairness_settings(env, expect):
    c = Config()
    configurer.update_fairness(c.GPUSpawnerMixin, env)
    for key, value in expect.items():
        assert c.GPUSpawnerMixin[key] == value
    if "WORKBENCH_TEST_CLOCK_FILE" not in env:
        assert "gpu_test_clock_file" not in c.GPUSpawnerMixin  # off by default


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"WORKBENCH_QUEUE_ORDER": "fairshare"}, "is not a queue order; use 'fifo'"),
        ({"WORKBENCH_QUEUE_ORDER": "lifo"}, "'fair-share'"),
        ({"WORKBENCH_QUEUE_AGING_MINUTES": "-1"}, "non-negative"),
        ({"WORKBENCH_TIME_ZONE": "Mars/Olympus"}, "is not a time zone"),
    ],
)
def test_bad_fairness_settings_are_a_sentence(env, words):
    with pytest.raises(ConfigError, match=words):
        configurer.update_fairness(Config().GPUSpawnerMixin, env)


def test_test_clock_flows_from_the_instant_written(tmp_path):
    path = tmp_path / "clock"
    assert abs((hub_clock("")() - datetime.now(UTC)).total_seconds()) < 2
    # Without the file: the real clock.
    assert abs((hub_clock(str(path))() - datetime.now(UTC)).total_seconds()) < 2
    start = datetime(2026, 12, 8, 10, 0, tzinfo=UTC)
    set_test_clock(path, start)
    os.utime(path, (time.time() - 30, time.time() - 30))
    now = hub_clock(str(path))()
    assert start + timedelta(seconds=29) <= now <= start + timedelta(seconds=33)
