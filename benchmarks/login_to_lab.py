"""Login-to-JupyterLab time for one user on the local backend, as a person sees it.

Starts a real hub (the same config as `make run`, simulated GPUs), signs up an
admin once, then N times: log in in Chromium, press Start with 1 GPU on the
spawn page, wait until JupyterLab's main area is drawn; stop the server and
log out. Prints each time and the median.

    .venv/bin/python benchmarks/login_to_lab.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from playwright.sync_api import sync_playwright

from tests.conftest import CHROMIUM, CHROMIUM_ARGS, Hub

PASSWORD = "correct-horse-battery"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        hub = Hub(Path(tmp), {"WORKBENCH_SIMULATED_GPUS": "4"}, [])
        hub.start()
        times = []
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page()
                page.goto(f"{hub.url}/hub/signup")
                page.fill("#username_input", "admin")
                page.fill("#password_input", PASSWORD)
                page.fill("#password_confirmation_input", PASSWORD)
                page.click("#signup_submit")
                page.wait_for_load_state()
                for run in range(args.runs):
                    context = browser.new_context()
                    page = context.new_page()
                    page.set_default_timeout(120_000)
                    page.goto(f"{hub.url}/hub/login")
                    page.fill("#username_input", "admin")
                    page.fill("#password_input", PASSWORD)
                    started = time.perf_counter()
                    page.click("#login_submit")
                    page.wait_for_url("**/hub/spawn**")
                    page.fill("#workbench-gpus", "1")
                    page.click("form#spawn_form [type=submit]")
                    page.wait_for_url("**/user/admin/lab**")
                    page.wait_for_selector("#jp-main-dock-panel")
                    elapsed = time.perf_counter() - started
                    times.append(elapsed)
                    print(f"run {run + 1}: {elapsed:.2f} s", flush=True)
                    context.close()
                    hub.api("DELETE", "/users/admin/server")
                    hub.wait_stopped("admin")
                browser.close()
        finally:
            hub.kill_everything()
    print(
        f"login-to-lab, local backend, median of {len(times)}: {statistics.median(times):.2f} s "
        f"(min {min(times):.2f}, max {max(times):.2f})"
    )


if __name__ == "__main__":
    main()
