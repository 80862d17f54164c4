"""Run the whole pytest suite as two lanes side by side: what `make test` (and so CI) runs.

The engine tests wait mostly on their own clusters (Slurm's munge,
slurmctld and two slurmd; Kubernetes' control plane and kubelet), the rest
mostly on Docker, hubs and Chromium; on CI's two cores the waits overlap
well. Lane ``engines`` is ``-m "slurm or kubernetes or second_lane"`` (the
engine tests, and tests/browser to balance the lanes: ``second_lane``),
lane ``main`` everything else, so every test runs exactly once. ``main`` prints as it
goes; ``engines`` writes ``tests/artifacts/lane-engines.log``, printed once
both lanes end. The exit
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
LOG = REPO / "tests" / "artifacts" / "lane-engines.log"
ENGINES = "slurm or kubernetes or second_lane"
NO_TESTS = 5


def main(argv: list[str]) -> int:
    LOG.parent.mkdir(parents=True, exist_ok=True)
    pytest = [sys.executable, "-m", "pytest"]
    started = time.monotonic()
    with open(LOG, "w") as log:
        engines = subprocess.Popen([*pytest, "-m", ENGINES, *argv], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            main_rc = subprocess.call([*pytest, "-m", f"not ({ENGINES})", *argv], cwd=REPO)
            main_s = time.monotonic() - started
            engines_rc = engines.wait()
        finally:
            if engines.poll() is None:
                engines.kill()
    both_s = time.monotonic() - started
    print("\n== lane engines (tests/artifacts/lane-engines.log) ==", flush=True)
    sys.stdout.write(LOG.read_text(errors="replace"))
    lanes = f"main exit {main_rc} after {main_s:.0f} s; engines exit {engines_rc}"
    print(f"== lanes: {lanes}; both done after {both_s:.0f} s")
    for rc in (main_rc, engines_rc):
        if rc not in (0, NO_TESTS):
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
