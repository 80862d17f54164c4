"""``on_stop``: let a notebook save its work when the hub is about to stop this server.

The hub announces every stop it decides (idle GPU reclaim, the end of a session, a
reservation taking the GPU back, maintenance) to the Jupyter server, which writes the live
notices to ``workbench-notices.json`` in the Jupyter runtime directory. ``on_stop`` watches
that file from a background thread in the kernel and calls your function once per stop:

* as soon as a notice's stop time is within ``lead`` seconds (120 by default), or the hub
  says it is stopping the server now, in the background thread;
* and, if that has not happened yet for this stop, when the kernel gets SIGTERM (the server
  is shutting down: it gives kernels ``WORKBENCH_KERNEL_GRACE`` seconds, 30 by default,
  before it kills them), in the main thread, before the kernel exits.

Two ways to use it in a training loop::

    from workbench_gpu_monitor import on_stop

    # 1. Check the flag each step and save in your own code, between two steps,
    #    where the model and optimizer are in a consistent state:
    stop = on_stop(lambda notice: print(notice["message"]))
    for step in range(steps):
        train_step()
        if stop.requested.is_set():
            torch.save({...}, checkpoint_path)
            break

    # 2. Or save in the callback itself (it runs in another thread, so take a copy
    #    of what it saves, e.g. ``model.state_dict()``, and keep it short):
    stop = on_stop(lambda notice: torch.save(model.state_dict(), checkpoint_path))

Save to your home (for example ``~/checkpoints/``): it survives the server, the rest of the
disk does not. When you run the cell again, call ``stop.cancel()`` on the old handle first,
or the old callback runs too. A callback that raises has its traceback printed; it is not
retried. The callback gets the notice as a dict: ``id``, ``kind`` (``idle``, ``session``,
``reservation``, ... or ``sigterm`` when the kernel was told to stop without a notice),
``message`` (the sentence the lab shows), ``stop_at`` (ISO time or None), ``stopping`` and
``seconds_left``.

This module needs no Jupyter server and imports nothing heavy: it is what a kernel imports.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

NOTICES_FILE = "workbench-notices.json"
POLL_SECONDS = 1.0
# How long a kernel that is exiting waits for a callback that is still saving in the background.
EXIT_WAIT_SECONDS = 60.0


def notices_path() -> str:
    """Where the server writes the live notices and kernels read them (the Jupyter runtime dir).

    The runtime dir is in the home, which a user's named servers may share: each named server
    (``JUPYTERHUB_SERVER_NAME``, inherited by its kernels) has a file of its own, so one server's stop
    never reaches another's kernels."""
    from jupyter_core.paths import jupyter_runtime_dir  # already imported in any ipykernel

    name = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
    if not name:
        return os.path.join(jupyter_runtime_dir(), NOTICES_FILE)
    safe = name if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name) else hashlib.sha256(name.encode()).hexdigest()[:16]
    return os.path.join(jupyter_runtime_dir(), NOTICES_FILE.replace(".json", f"-{safe}.json"))


def read_notices(path: str) -> list[dict]:
    """The notices in the file; none when it is missing, half-written or not ours."""
    try:
        with open(path, encoding="utf-8") as fh:
            body = json.load(fh)
    except (OSError, ValueError):
        return []
    items = body.get("notices") if isinstance(body, dict) else None
    if not isinstance(items, list):
        return []
    return [n for n in items if isinstance(n, dict) and n.get("id") is not None]


def seconds_left(notice: dict, now: datetime | None = None) -> float | None:
    """Seconds until the notice's stop_at (0 when past), None without a (readable) stop time."""
    stop_at = notice.get("stop_at")
    if not isinstance(stop_at, str):
        return None
    try:
        when = datetime.fromisoformat(stop_at.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def is_due(notice: dict, lead: float, now: datetime | None = None) -> bool:
    """A stop to act on now: the hub says it is stopping, or the stop time is within ``lead`` seconds."""
    if notice.get("stopping") is True:
        return True
    left = seconds_left(notice, now)
    return left is not None and left <= lead


def _for_callback(notice: dict) -> dict:
    out = {k: notice.get(k) for k in ("id", "kind", "message", "stop_at")}
    out["id"] = str(out["id"])
    out["stopping"] = notice.get("stopping") is True
    out["seconds_left"] = seconds_left(notice)
    return out


def _print_error(what: str) -> None:
    """Show a callback's failure where the student looks (the cell) and in the server log."""
    text = f"workbench_gpu_monitor.on_stop: {what} failed:\n{traceback.format_exc()}"
    print(text, file=sys.stderr, flush=True)
    if sys.__stderr__ is not None and sys.__stderr__ is not sys.stderr:
        with contextlib.suppress(OSError, ValueError):
            print(text, file=sys.__stderr__, flush=True)


class StopHandle:
    """What ``on_stop`` returns: ``requested`` (an Event set when a stop is announced), ``notice``, ``cancel()``."""

    def __init__(self, callback: Callable[[dict], Any], lead: float, watcher: _Watcher) -> None:
        self.callback = callback
        self.lead = float(lead)
        self.requested = threading.Event()
        self.notice: dict | None = None
        self._watcher = watcher
        self._fired: set[str] = set()
        self._cancelled = False
        # Re-entrant: a second SIGTERM arriving while the main thread runs the callback must not deadlock.
        self._lock = threading.RLock()

    def fire(self, notice: dict) -> bool:
        """Call the callback for this stop unless it was called for it already; True if it ran now.

        A call for the same stop from another thread waits for the running one to finish,
        so a kernel told to exit does not exit in the middle of a save."""
        with self._lock:
            stop_id = str(notice.get("id"))
            if self._cancelled or stop_id in self._fired:
                return False
            self._fired.add(stop_id)
            self.notice = _for_callback(notice)
            self.requested.set()
            try:
                self.callback(dict(self.notice))
            except BaseException:  # noqa: BLE001 - a student's callback: show it, keep the kernel
                _print_error(f"the callback {getattr(self.callback, '__name__', self.callback)!r}")
            return True

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no callback of this handle is running; False if one still is after ``timeout``."""
        if self._lock.acquire(timeout=timeout):
            self._lock.release()
            return True
        return False

    def cancel(self) -> None:
        """Stop watching for this callback (call it on the old handle before registering a new one)."""
        with self._lock:
            self._cancelled = True
        self._watcher.remove(self)

    def __repr__(self) -> str:
        state = "cancelled" if self._cancelled else ("requested" if self.requested.is_set() else "watching")
        return f"<StopHandle {state} lead={self.lead:g}s notice={self.notice!r}>"


class _Watcher:
    """One daemon thread per notices file: a stat each second, a read only when the file changed."""

    def __init__(self, path: str, interval: float = POLL_SECONDS) -> None:
        self.path = path
        self.interval = interval
        self.handles: list[StopHandle] = []
        self.notices: list[dict] = []
        self._seen: tuple | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, handle: StopHandle) -> None:
        with self._lock:
            self.handles.append(handle)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="workbench-on-stop", daemon=True)
                self._thread.start()

    def remove(self, handle: StopHandle) -> None:
        with self._lock:
            if handle in self.handles:
                self.handles.remove(handle)

    def refresh(self) -> list[dict]:
        """Re-read the file if its mtime, size or inode changed (the server replaces it atomically)."""
        try:
            st = os.stat(self.path)
            key: tuple | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            key = None
        if key != self._seen:
            self._seen = key
            self.notices = read_notices(self.path) if key is not None else []
        return self.notices

    def check(self) -> None:
        notices = self.refresh()
        with self._lock:
            handles = list(self.handles)
        now = datetime.now(UTC)
        for notice in notices:
            for handle in handles:
                if is_due(notice, handle.lead, now):
                    handle.fire(notice)

    def _run(self) -> None:
        while True:
            time.sleep(self.interval)
            try:
                self.check()
            except Exception:  # noqa: BLE001 - keep watching whatever one pass met
                _print_error("watching the stop notices")


_watchers: dict[str, _Watcher] = {}
_watchers_lock = threading.Lock()
_previous_sigterm: Any = None
_sigterm_installed = False


def _all_handles() -> list[StopHandle]:
    with _watchers_lock:
        watchers = list(_watchers.values())
    return [h for w in watchers for h in list(w.handles)]


def _stop_for_sigterm(watcher: _Watcher) -> dict:
    """The stop a SIGTERM belongs to: the announced one if the file has it, else a stop of its own."""
    notices = read_notices(watcher.path)
    stopping = [n for n in notices if n.get("stopping") is True]
    timed = sorted((n for n in notices if seconds_left(n) is not None), key=lambda n: seconds_left(n) or 0.0)
    if stopping or timed:
        return (stopping + timed)[0]
    return {
        "id": f"sigterm-{os.getpid()}",
        "kind": "sigterm",
        "message": "The kernel was told to stop (SIGTERM): the server is shutting down.",
        "stop_at": datetime.now(UTC).isoformat(),
        "stopping": True,
    }


def _on_sigterm(signum: int, frame: Any) -> None:
    """Run every callback not yet run for this stop (in the main thread), then end as SIGTERM would."""
    with _watchers_lock:
        watchers = list(_watchers.values())
    for watcher in watchers:
        notice = _stop_for_sigterm(watcher)
        for handle in list(watcher.handles):
            handle.wait_idle(EXIT_WAIT_SECONDS)  # a save already running in the background
            handle.fire(notice)
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    # SIG_DFL (or a handler not installed from Python): end the process the way SIGTERM does.
    # Not SystemExit: IPython catches it in a cell and the kernel would go on.
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm() -> bool:
    """Chain our SIGTERM handler before the current one; only the main thread may set handlers."""
    global _previous_sigterm, _sigterm_installed
    if threading.current_thread() is not threading.main_thread():
        return False
    if _sigterm_installed and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        return True
    _previous_sigterm = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _on_sigterm)
    _sigterm_installed = True
    return True


def _wait_at_exit() -> None:
    """A kernel shut down politely must not end in the middle of a background save."""
    for handle in _all_handles():
        handle.wait_idle(EXIT_WAIT_SECONDS)


def on_stop(callback: Callable[[dict], Any], lead: float = 120, *, path: str | None = None) -> StopHandle:
    """Call ``callback(notice)`` once per announced stop of this server; return a ``StopHandle``.

    ``lead``: how many seconds before the announced stop time to call it (a save that takes
    longer needs more). ``path``: the notices file, for tests; by default the Jupyter runtime
    directory's ``workbench-notices.json``. See the module docstring for a training loop.
    The SIGTERM handler is installed only when this is called from the main thread (as a
    notebook cell is); from another thread only the announced stops are seen.
    """
    if not callable(callback):
        raise TypeError("on_stop needs a function to call, for example on_stop(save_checkpoint)")
    if lead < 0:
        raise ValueError("lead is a number of seconds before the stop, 0 or more")
    path = path or notices_path()
    with _watchers_lock:
        first = not _watchers
        watcher = _watchers.setdefault(path, _Watcher(path))
    if first:
        import atexit

        atexit.register(_wait_at_exit)
    handle = StopHandle(callback, lead, watcher)
    watcher.add(handle)
    _install_sigterm()
    return handle
