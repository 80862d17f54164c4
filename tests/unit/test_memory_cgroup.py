"""The memory cgroup reader, from tables of fake cgroup directories (v1 with and without ``oom_kill``, v2,
no limit, missing files), and the watcher that records when the OOM-kill count rose."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

# The extension's source, ahead of the wheel installed in the venv.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "extensions" / "gpu-monitor"))

from workbench_gpu_monitor.memory_cgroup import MemoryWatcher, Reading, find_cgroup, read_cgroup

GIB = 1 << 30
V1_NO_LIMIT = "9223372036854771712"


def fake(tmp_path: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return str(tmp_path)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        # cgroup v2 with a 16 GiB limit and two kills
        (
            {
                "memory.max": f"{16 * GIB}\n",
                "memory.current": "123456\n",
                "memory.events": "low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\noom_group_kill 0\n",
            },
            Reading("v2", 16 * GIB, 123456, 2),
        ),
        # v2 without a limit
        ({"memory.max": "max\n", "memory.current": "5\n", "memory.events": "oom_kill 0\n"}, Reading("v2", None, 5, 0)),
        # v2 with memory.events missing (an old kernel): no kill count, the rest read
        ({"memory.max": "1024\n", "memory.current": "5\n"}, Reading("v2", 1024, 5, None)),
        # v1 with the oom_kill line (kernels 4.13 and newer)
        (
            {
                "memory.limit_in_bytes": f"{2 * GIB}\n",
                "memory.usage_in_bytes": "77\n",
                "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
                "memory.failcnt": "40\n",
            },
            Reading("v1", 2 * GIB, 77, 3, 40),
        ),
        # v1 without the oom_kill line: no kill count, failcnt kept as the fallback
        (
            {
                "memory.limit_in_bytes": f"{2 * GIB}\n",
                "memory.usage_in_bytes": "77\n",
                "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n",
                "memory.failcnt": "4\n",
            },
            Reading("v1", 2 * GIB, 77, None, 4),
        ),
        # v1 without a limit (LONG_MAX rounded to a page) and without failcnt
        (
            {"memory.limit_in_bytes": V1_NO_LIMIT + "\n", "memory.usage_in_bytes": "1\n"},
            Reading("v1", None, 1, None, None),
        ),
        # a limit of 2**60 or more is no limit too; garbage reads as unknown
        ({"memory.max": str(2**60), "memory.current": "junk"}, Reading("v2", None, None, None)),
        # no memory cgroup files at all
        ({"cpu.max": "max 100000\n"}, Reading()),
    ],
)
def test_fake_cgroup_dirs_read_as_the_table_says(tmp_path, files, expected):
    directory = fake(tmp_path, files)
    reading = read_cgroup(directory)
    want = expected if expected.cgroup is None else Reading(**{**expected.__dict__, "source": directory})
    assert reading == want


def test_no_directory_and_a_missing_directory_read_as_nothing(tmp_path):
    assert read_cgroup(None) == Reading()
    assert read_cgroup(str(tmp_path / "gone")) == Reading()


def test_a_v2_limit_on_a_parent_cgroup_counts(tmp_path):
    job = tmp_path / "job_7"
    step = job / "step_batch"
    step.mkdir(parents=True)
    fake(job, {"memory.max": f"{4 * GIB}\n"})
    fake(step, {"memory.max": "max\n", "memory.current": "10\n", "memory.events": "oom_kill 0\n"})
    assert read_cgroup(str(step), (str(job),)).limit_bytes == 4 * GIB
    assert read_cgroup(str(step)).limit_bytes is None


def test_find_cgroup_prefers_the_env_then_proc_self_cgroup(tmp_path):
    assert find_cgroup({"WORKBENCH_MEMORY_CGROUP": "/x"}, "0::/anything") == ("/x", ())
    root = tmp_path / "cgroup"
    leaf = root / "system.slice" / "job_1"
    leaf.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("memory\n")
    (leaf / "memory.current").write_text("1\n")
    found, parents = find_cgroup({}, "0::/system.slice/job_1\n", root=str(root))
    assert found == str(leaf)
    assert parents == (str(root / "system.slice"), str(root))
    # A cgroup namespace shows "/" (or a path not under this mount): the mount's own root.
    assert find_cgroup({}, "0::/elsewhere\n", root=str(root))[0] == str(root)
    # v1: the memory controller's line
    v1 = tmp_path / "v1"
    (v1 / "memory" / "docker" / "abc").mkdir(parents=True)
    (v1 / "memory" / "docker" / "abc" / "memory.usage_in_bytes").write_text("1\n")
    assert find_cgroup({}, "12:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n", root=str(v1))[0] == str(
        v1 / "memory" / "docker" / "abc"
    )
    assert find_cgroup({}, "", root=str(tmp_path / "none")) == (None, ())


class Clock:
    def __init__(self):
        self.t = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)

    def __call__(self):
        return self.t


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_watcher_records_when_the_kill_count_rose_and_only_then(tmp_path, version):
    if version == "v2":
        files = {"memory.max": f"{GIB}\n", "memory.current": "1\n"}
        counter, line = "memory.events", "oom 0\noom_kill {}\n"
    else:
        files = {"memory.limit_in_bytes": f"{GIB}\n", "memory.usage_in_bytes": "1\n", "memory.failcnt": "0\n"}
        counter, line = "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill {}\n"
    directory = fake(tmp_path, {**files, counter: line.format(5)})
    clock = Clock()
    watcher = MemoryWatcher(directory, now=clock)
    first = watcher.snapshot()
    # A count already there when the server started is not a kill of this server's kernels.
    assert first["oom_kills"] == 5
    assert first["last_oom_kill_at"] is None
    assert first["cgroup"] == version
    assert first["limit_bytes"] == GIB
    assert first["source"] == directory
    clock.t = clock.t.replace(minute=5)
    watcher.poll()
    assert watcher.snapshot()["last_oom_kill_at"] is None
    (tmp_path / counter).write_text(line.format(6))
    watcher.poll()
    assert watcher.snapshot()["last_oom_kill_at"] == "2026-12-06T10:05:00+00:00"
    clock.t = clock.t.replace(minute=9)
    watcher.poll()  # unchanged count: the time stays that of the kill
    assert watcher.snapshot() == {**first, "oom_kills": 6, "last_oom_kill_at": "2026-12-06T10:05:00+00:00"}


def test_v1_without_the_oom_kill_line_falls_back_on_failcnt(tmp_path):
    base = {"memory.limit_in_bytes": f"{GIB}\n", "memory.usage_in_bytes": "1\n", "memory.oom_control": "under_oom 0\n"}
    directory = fake(tmp_path, {**base, "memory.failcnt": "3\n"})
    clock = Clock()
    watcher = MemoryWatcher(directory, now=clock)
    watcher.poll()
    watcher.poll()
    assert watcher.snapshot()["last_oom_kill_at"] is None
    (tmp_path / "memory.failcnt").write_text("4\n")
    watcher.poll()
    snap = watcher.snapshot()
    assert snap["oom_kills"] is None
    assert snap["last_oom_kill_at"] == clock.t.isoformat()


def test_files_that_vanish_do_not_break_the_watcher(tmp_path):
    directory = fake(tmp_path, {"memory.max": "max\n", "memory.current": "1\n", "memory.events": "oom_kill 1\n"})
    watcher = MemoryWatcher(directory, now=Clock())
    watcher.poll()
    for name in ("memory.max", "memory.current", "memory.events"):
        (tmp_path / name).unlink()
    watcher.poll()
    assert watcher.snapshot() == {
        "cgroup": None,
        "limit_bytes": None,
        "usage_bytes": None,
        "oom_kills": None,
        "last_oom_kill_at": None,
        "source": None,
    }
