"""Run the whole pytest suite as three lanes side by side, and the version matrix: what `make test` (and CI) runs.

Most tests wait: on their own clusters (Slurm's munge, slurmctld and two
slurmd; Kubernetes' control plane and kubelet), on Docker, on hubs starting
and stopping, on Chromium. With two lanes CI's load average stayed between
1 and 2 on its two cores while both lanes took about 68 minutes (measured
2026-12-07: main 4,090 s, engines 3,150 s then the version matrix 895 s), so
the suite runs as three pytest processes whose waits overlap:

* ``engines``: ``-m "slurm or kubernetes or second_lane"`` (the engine
  tests and the conformance suite's engine tiers, and tests/browser:
  ``second_lane``), then ``make test-newest``;
* ``hubs``: the directories in ``HUBS_PATHS`` (local hubs and the workbench
  service, which mostly wait on the hubs they start), less any engine test
  among them;
* ``main``: everything else (Docker, the conformance suite's fake and
  docker tiers, the unit tests, the GPU monitor, SSH, HTTPS, notebooks),
  then ``make test-lowest``.

So every test runs exactly once. ``main`` prints as it goes; the others
write ``tests/artifacts/lane-<name>.log``, printed once all lanes end, then
each lane's slowest modules (from its JUnit report) so CI's own log says
where the time went and the lanes can be balanced again.

The version matrix (``make test-lowest``, ``make test-newest``: the unit
tests and the conformance suite's fake tiers against the lowest and the
newest versions the ranges allow, each in its venv) is split over two
slots, after their lane's tests. ``WORKBENCH_MATRIX=0`` leaves it out (a
quick local run).

The exit status is the first failing lane's (pytest's "no tests collected",
5, counts as passing: a selection may leave a lane empty).

    python tests/lanes.py [pytest arguments...]

Plain ``pytest`` still runs everything in one process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "tests" / "artifacts"
# Each lane's JUnit report: the seconds every test took (setup, call and teardown), summed per module below.
JUNIT = str(ARTIFACTS / "junit-{lane}.xml")
# The version matrix, one venv at a time, each after a lane's tests.
MATRIX = {
    name: ["make", "--no-print-directory", f"test-{name}", "PYTEST_ARGS=-q -p no:cacheprovider"]
    for name in ("lowest", "newest")
}
ENGINES = "slurm or kubernetes or second_lane"
# The hubs lane's directories (relative to the repository): tests that start hubs and wait on them.
HUBS_PATHS = ("tests/integration", "tests/service")
NO_TESTS = 5


def lane_commands(pytest: list[str], argv: list[str]) -> dict[str, list[str]]:
    """Each lane's pytest command: disjoint selections that together are the whole suite."""
    junit = {lane: f"--junitxml={JUNIT.format(lane=lane)}" for lane in ("main", "engines", "hubs")}
    ignored = [f"--ignore={path}" for path in HUBS_PATHS]
    return {
        "main": [*pytest, "-m", f"not ({ENGINES})", *ignored, junit["main"], *argv],
        "engines": [*pytest, "-m", ENGINES, junit["engines"], *argv],
        "hubs": [*pytest, "-m", f"not ({ENGINES})", junit["hubs"], *argv, *HUBS_PATHS],
    }


def _run(command: list[str], name: str) -> int:
    """Run ``command``: ``main`` on this process's output, any other with its output in
    ``tests/artifacts/lane-<name>.log``; its exit status."""
    if name == "main":
        return subprocess.call(command, cwd=REPO)
    with open(ARTIFACTS / f"lane-{name}.log", "w") as log:
        started = time.monotonic()
        rc = subprocess.call(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        log.write(f"== {name} exit {rc} after {time.monotonic() - started:.0f} s\n")
    return rc


def _module(classname: str) -> str:
    """``tests.unit.test_x`` of a JUnit classname ``tests.unit.test_x`` or ``tests.unit.test_x.TestCase``."""
    parts = classname.split(".")
    modules = [i for i, part in enumerate(parts) if part.startswith("test_")]
    return ".".join(parts[: modules[-1] + 1]) if modules else classname or "?"


def module_seconds(lane: str, top: int = 25) -> str:
    """The lane's slowest test modules by the seconds their tests took (JUnit ``time``, fixtures included):
    where a lane's time goes, so the lanes can be balanced and slow suites split from CI's own log."""
    try:
        cases = ElementTree.parse(JUNIT.format(lane=lane)).iter("testcase")
    except (OSError, ElementTree.ParseError) as exc:
        return f"== lane {lane}: no JUnit report ({exc})"
    seconds: Counter[str] = Counter()
    for case in cases:
        seconds[_module(case.get("classname", ""))] += float(case.get("time") or 0)
    rows = [f"{s:8.0f} s  {module}" for module, s in seconds.most_common(top)]
    return f"== lane {lane}: {sum(seconds.values()):.0f} s in tests, slowest modules:\n" + "\n".join(rows)


def main(argv: list[str]) -> int:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pytest = [sys.executable, "-m", "pytest"]
    matrix = os.environ.get("WORKBENCH_MATRIX", "1") != "0"
    commands: dict[str, list[str]] = {**lane_commands(pytest, argv), **(MATRIX if matrix else {})}
    slots = [["main", "lowest"], ["engines", "newest"], ["hubs"]]
    started = time.monotonic()
    rcs: dict[str, int] = {}
    ended: dict[str, float] = {}

    def slot(names: list[str]) -> None:
        # A slot runs its commands one after the other.
        for name in names:
            if name in commands:
                rcs[name] = _run(commands[name], name)
                ended[name] = time.monotonic() - started

    threads = [threading.Thread(target=slot, args=(names,)) for names in slots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ran = [name for names in slots for name in names if name in rcs]
    for name in ran:
        if name != "main":
            print(f"\n== {name} (tests/artifacts/lane-{name}.log) ==", flush=True)
            sys.stdout.write((ARTIFACTS / f"lane-{name}.log").read_text(errors="replace"))
    for lane in ("main", "engines", "hubs"):
        print(module_seconds(lane), flush=True)
    ends = "; ".join(f"{name} exit {rcs[name]} at {ended[name]:.0f} s" for name in ran)
    print(f"== lanes: {ends}; all done after {time.monotonic() - started:.0f} s", flush=True)
    failed = [rcs[name] for name in ran if rcs[name] not in (0, NO_TESTS)]
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
