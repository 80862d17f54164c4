"""``python -m workbench_hub.service``: catches SIGINT and SIGTERM from the first line on.

The imports below take a second or more on a busy host; a hub that stops its
services right after starting them must not find one that ignores or dies of
the signal in that second (``lifetime.Lifetime`` acts on what was caught here).
"""

import signal
import sys

received: list[str] = []


def _remember(signum, frame) -> None:
    received.append(signal.Signals(signum).name)


for _sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(_sig, _remember)

from .app import main  # noqa: E402  (after the handlers: the imports are what takes time)

sys.exit(main(early=received))
