"""Run the whole pytest suite as two lanes side by side: what `make test` (and so CI) runs.

The Slurm tests wait mostly on their own two-node cluster (munge, slurmctld,
two slurmd; no Docker, no browser), the rest mostly on Docker, hubs and
Chromium; on CI's two cores the two waits overlap well. Lane ``slurm`` is
``-m slurm``, lane ``main`` everything else (``-m "not slurm"``), so every
test runs exactly once. ``main`` prints as it goes; ``slurm`` writes
``tests/artifacts/lane-slurm.log``, printed once both lanes end. The exit
status is the first failing lane's (pytest's "no tests collected", 5, counts
as passing: a selection may leave a lane empty).

    python tests/lanes.py [pytest arguments...]

Plain ``pytest`` still runs everything in one process.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOG = REPO / "tests" / "artifacts" / "lane-slurm.log"
NO_TESTS = 5


def main(argv: list[str]) -> int:
    LOG.parent.mkdir(parents=True, exist_ok=True)
    pytest = [sys.executable, "-m", "pytest"]
    started = time.monotonic()
    with open(LOG, "w") as log:
        slurm = subprocess.Popen([*pytest, "-m", "slurm", *argv], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            main_rc = subprocess.call([*pytest, "-m", "not slurm", *argv], cwd=REPO)
            main_s = time.monotonic() - started
            slurm_rc = slurm.wait()
        finally:
            if slurm.poll() is None:
                slurm.kill()
    both_s = time.monotonic() - started
    print("\n== lane slurm (tests/artifacts/lane-slurm.log) ==", flush=True)
    sys.stdout.write(LOG.read_text(errors="replace"))
    print(f"== lanes: main exit {main_rc} after {main_s:.0f} s; slurm exit {slurm_rc}; both done after {both_s:.0f} s")
    for rc in (main_rc, slurm_rc):
        if rc not in (0, NO_TESTS):
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
