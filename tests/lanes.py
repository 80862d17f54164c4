"""Run the whole pytest suite as two lanes side by side, then the version matrix: what `make test` (and CI) runs.

The engine tests wait mostly on their own clusters (Slurm's munge,
slurmctld and two slurmd; Kubernetes' control plane and kubelet), the rest
mostly on Docker, hubs and Chromium; on CI's two cores the waits overlap
well. Lane ``engines`` is ``-m "slurm or kubernetes or second_lane"`` (the
engine tests, and tests/browser to balance the lanes: ``second_lane``),
lane ``main`` everything else, so every test runs exactly once. ``main`` prints as it
goes; ``engines`` writes ``tests/artifacts/lane-engines.log``, printed once
both lanes end.

The version matrix (``make test-lowest test-newest``: the unit tests and the
conformance suite's fake tiers against the lowest and the newest versions the
ranges allow, each in its venv) runs in the engines lane's slot once the
engine tests end, while ``main`` still runs: it adds about 8 minutes of one
core's work, and ``main`` is the longer lane by about as much, so CI's wall
time hardly grows. Its output goes to ``tests/artifacts/lane-matrix.log``,
printed at the end. ``WORKBENCH_MATRIX=0`` leaves it out (a quick local run).

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
LOG = REPO / "tests" / "artifacts" / "lane-engines.log"
MATRIX_LOG = REPO / "tests" / "artifacts" / "lane-matrix.log"
# Each lane's JUnit report: the seconds every test took (setup, call and teardown), summed per module below.
JUNIT = str(REPO / "tests" / "artifacts" / "junit-{lane}.xml")
MATRIX = ["make", "--no-print-directory", "test-lowest", "test-newest", "PYTEST_ARGS=-q -p no:cacheprovider"]
ENGINES = "slurm or kubernetes or second_lane"
NO_TESTS = 5


def _engines_then_matrix(pytest: list[str], argv: list[str], matrix: bool) -> tuple[int, int]:
    """The engines lane, then (when ``matrix``) the version matrix in the same slot: both exit statuses."""
    with open(LOG, "w") as log:
        engines_rc = subprocess.call(
            [*pytest, "-m", ENGINES, f"--junitxml={JUNIT.format(lane='engines')}", *argv],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if not matrix:
        return engines_rc, 0
    with open(MATRIX_LOG, "w") as log:
        started = time.monotonic()
        matrix_rc = subprocess.call(MATRIX, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        log.write(f"== version matrix exit {matrix_rc} after {time.monotonic() - started:.0f} s\n")
    return engines_rc, matrix_rc


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
    LOG.parent.mkdir(parents=True, exist_ok=True)
    pytest = [sys.executable, "-m", "pytest"]
    matrix = os.environ.get("WORKBENCH_MATRIX", "1") != "0"
    started = time.monotonic()
    # The second slot is a thread running subprocesses one after the other (no output of its own).
    result: dict[str, tuple[int, int]] = {}
    second = threading.Thread(target=lambda: result.update(rcs=_engines_then_matrix(pytest, argv, matrix)))
    second.start()
    main_rc = subprocess.call(
        [*pytest, "-m", f"not ({ENGINES})", f"--junitxml={JUNIT.format(lane='main')}", *argv], cwd=REPO
    )
    main_s = time.monotonic() - started
    second.join()
    engines_rc, matrix_rc = result.get("rcs", (1, 1))
    both_s = time.monotonic() - started
    print("\n== lane engines (tests/artifacts/lane-engines.log) ==", flush=True)
    sys.stdout.write(LOG.read_text(errors="replace"))
    if matrix:
        print("\n== version matrix (tests/artifacts/lane-matrix.log) ==", flush=True)
        sys.stdout.write(MATRIX_LOG.read_text(errors="replace"))
    for lane in ("main", "engines"):
        print(module_seconds(lane), flush=True)
    lanes = f"main exit {main_rc} after {main_s:.0f} s; engines exit {engines_rc}"
    lanes += f"; version matrix exit {matrix_rc}" if matrix else ""
    print(f"== lanes: {lanes}; all done after {both_s:.0f} s")
    for rc in (main_rc, engines_rc):
        if rc not in (0, NO_TESTS):
            return rc
    return matrix_rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
