"""Run a command that ends when its parent process dies: the hub's managed services.

JupyterHub starts its managed services (the workbench service, the idle
culler) as child processes in a session of their own and stops them when it
shuts down cleanly. When the hub is killed instead (``kill -9``, the OOM
killer, a crashed container runtime) nothing stops them: the old workbench
service keeps its port, so the restarted hub's service cannot bind it, and
the old culler keeps culling with a token of a hub that no longer exists.

This launcher closes that gap on Linux. It asks the kernel to send the
process SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``), checks
that the parent did not already die before that request, and then replaces
itself with the command (``exec``), which keeps the request::

    python -m workbench_hub.parent_guard [--parent-pid=PID] -- CMD [ARG...]

``--parent-pid`` is the process that must be alive (the hub passes its own
pid); without it, the parent at the moment the launcher starts. The kernel
signals when the *thread* that forked the child ends; JupyterHub starts
services from its main thread (the event loop), whose end is the process's.

SIGINT is given its default disposition (a hub started with SIGINT ignored
would pass that on), and nothing more, on purpose. Ctrl-C in a terminal reaches only the
hub's process group (JupyterHub starts services in sessions of their own);
the hub then stops each service in turn with SIGINT, waits up to 10 seconds
(the spawner's ``interrupt_timeout``, which JupyterHub does not let config
change for services), then SIGTERM. Ignoring SIGINT here would make every
Ctrl-C take 10 seconds per service (measured: over 30 s instead of 2 s); both
services end quietly on SIGINT instead (the idle culler catches the
KeyboardInterrupt around its event loop, the workbench service handles it).

Elsewhere than Linux the launcher only execs the command.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
USAGE = "usage: python -m workbench_hub.parent_guard [--parent-pid=PID] -- CMD [ARG...]"


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent ends (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")


def parse(argv: list[str]) -> tuple[int | None, list[str]]:
    """``[--parent-pid=PID] -- CMD...`` -> (PID or None, CMD)."""
    if "--" not in argv:
        raise SystemExit(USAGE)
    at = argv.index("--")
    options, command = argv[:at], argv[at + 1 :]
    parent = None
    for option in options:
        if option.startswith("--parent-pid=") and option.split("=", 1)[1].isdigit():
            parent = int(option.split("=", 1)[1])
        else:
            raise SystemExit(f"unknown option {option!r}\n{USAGE}")
    if not command:
        raise SystemExit(USAGE)
    return parent, command


def main(argv: list[str] | None = None) -> None:
    parent, command = parse(sys.argv[1:] if argv is None else argv)
    if parent is None:
        parent = os.getppid()
    die_with_parent(signal.SIGTERM)
    # A hub started where SIGINT is ignored (a script's `cmd &`, nohup in a non-interactive shell) passes
    # that on, and a service that ignores SIGINT makes the hub wait 30 s for it at every stop: give the
    # service the default, which Python turns into KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # The parent may have died between our fork and the prctl above: then the
    # kernel will never signal, and we must not start at all.
    if os.getppid() != parent:
        raise SystemExit(f"parent_guard: parent process {parent} is gone; not starting {command[0]}")
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        raise SystemExit(f"parent_guard: cannot run {command[0]}: {exc.strerror}") from None


if __name__ == "__main__":
    main()
