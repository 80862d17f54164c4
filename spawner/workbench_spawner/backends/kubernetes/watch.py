"""KubeSpawner's pod and event watches, kept alive for as long as the API server is away.

KubeSpawner follows pods and events through shared *reflectors*: a list,
then a watch, retried with backoff when it breaks. After about 50 s of
failures a reflector gives up ("Watching resources never recovered, giving
up") and calls its ``on_failure``; in KubeSpawner 7.1's default
one-namespace mode ``_start_reflector`` passes none, so the reflector is
dead and every spawner reads a frozen view for good: a pod deleted later
keeps its lease, a new pod is never seen (its spawn never finishes), a
deleted one never disappears (its stop never finishes).

What this module does instead (docs/kubernetes.md, "When the API server is
away"): the hub keeps running and restarts the watch **in place**, on the
same reflector object, for as long as it takes:

* ``KeptWatch`` gives KubeSpawner's own reflector classes an ``on_failure``
  (their public hook) that starts a keeper: it probes the API server after
  1 s, then every 2, 4, ... up to 30 s, and once it answers calls the
  reflector's public ``start()`` again, which lists everything afresh
  (so what changed meanwhile, a pod deleted during the outage, is seen) and
  watches from there. The last view stays readable meanwhile: a pod is never
  taken for gone merely because the API server did not answer.
* A reader that needs a live view (a spawner's poll, a start, a stop) cuts
  the backoff short (``kick``) and waits a few seconds for that attempt, so
  once the API server is back the view is whole again **within one poll**.
* When a watch is back, ``on_recovered`` runs: the spawner wakes the GPU
  policy's reconciler (``reconcile_soon``), which closes the leases of pods
  that went away meanwhile with their true reason.

Why not exit and let a supervisor restart the hub: the hub also serves every
user whose server runs (the proxy keeps routing, but logins, spawns of other
backends' profiles and the workbench service go through the hub), and a
restart would only reconnect to the same absent API server; a restarted hub
also re-lists every pod, which is what the in-place restart does anyway.

The one reach into KubeSpawner's private API is ``KeptWatches._start_reflector``
(see its docstring for the upstream issue); everything else uses the
reflector's public ``on_failure``, ``start()``, ``stop()`` and ``watch_task``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from workbench_spawner.backends.kubernetes.cluster import KubernetesUnavailableError

if TYPE_CHECKING:
    # What the two mixins go in front of, for the checker: KubeSpawner's reflector and its spawner (KubeSpawner
    # ships no type information, so their members are Any to it).
    from kubespawner import KubeSpawner as _SpawnerBase
    from kubespawner.reflector import ResourceReflector as _ReflectorBase
else:
    _ReflectorBase = _SpawnerBase = object

log = logging.getLogger("workbench.kubernetes")

# The keeper's backoff between attempts: first, then doubling up to the last (seconds).
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0
# A reader's kick never makes attempts closer together than this (many spawners poll at once).
MIN_ATTEMPT_GAP = 1.0
# How long a reader that kicked waits for the attempt before it goes on with the last view.
KICK_WAIT = 5.0
# The probe's own timeout: an API server that accepts connections but does not answer counts as away.
PROBE_TIMEOUT = 5


class KeptWatch(_ReflectorBase):
    """A mixin for KubeSpawner's reflector classes (``kept(PodReflector)``): a watch that gave up is restarted.

    Needs a ``ResourceReflector`` after it in the bases. ``on_recovered`` is
    called (on the event loop) each time the watch is back after having given up."""

    first_load_future: asyncio.Future[Any]  # ResourceReflector's; replaced here when its first list failed

    def __init__(self, *args: Any, on_failure: Callable[[], None] | None = None, **kwargs: Any) -> None:
        # KubeSpawner's own on_failure (with enable_user_namespaces) halts the hub; ours restarts the watch.
        super().__init__(*args, on_failure=None, **kwargs)
        self.on_failure = self._gave_up
        self.on_recovered: Callable[[], None] = lambda: None
        self.gave_up_at: float | None = None  # monotonic, while the watch is down
        self._keeper: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._last_attempt = 0.0
        self._last_said = 0.0

    # -- state ---------------------------------------------------------------------------------

    @property
    def watching(self) -> bool:
        """Whether the watch task runs (it may be retrying inside; it gives up on its own after ~50 s)."""
        task = self.watch_task
        return task is not None and not task.done()

    @property
    def loaded(self) -> bool:
        """Whether this reflector ever listed its resources: an empty view that was never loaded means nothing."""
        future = self.first_load_future
        return future.done() and not future.cancelled() and future.exception() is None

    # -- giving up, and coming back --------------------------------------------------------------

    def _gave_up(self) -> None:
        """``on_failure``: KubeSpawner's watch loop ends right after this; keep the view and start the keeper."""
        self.gave_up_at = self.gave_up_at or time.monotonic()
        self.log.warning(
            "The %s watch gave up (the Kubernetes API server did not answer for about a minute); the hub keeps "
            "its last view and restarts the watch as soon as the API server answers (tries after 1 s, then "
            "up to every %g s)",
            self.kind,
            BACKOFF_MAX,
        )
        if not self._stopping:
            self._ensure_keeper()

    def _ensure_keeper(self) -> asyncio.Task:
        """The keeper task, started unless it runs."""
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self._keep(), name=f"keep-{self.kind}-watch")
        return self._keeper

    async def _keep(self) -> None:
        """Try to restart the watch with backoff until it runs again or the reflector is stopped."""
        delay = BACKOFF_FIRST
        while not self._stopping:
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except TimeoutError:
                delay = min(delay * 2, BACKOFF_MAX)
            self._wake.clear()  # after the wait: a kick made before this task ran still counts
            gap = MIN_ATTEMPT_GAP - (time.monotonic() - self._last_attempt)
            if gap > 0:
                await asyncio.sleep(gap)
            if self._stopping or await self._attempt():
                return

    async def _attempt(self) -> bool:
        """One try: probe the API server, then list and watch again (``start()``). True when watching."""
        self._last_attempt = time.monotonic()
        if self.watching:
            return True
        try:
            # A cheap probe first (the API group's resource list): start() logs a traceback per failed list.
            await self.api.get_api_resources(_request_timeout=PROBE_TIMEOUT)
            if self.first_load_future.done() and not self.loaded:
                # The first list failed (the API server was away when KubeSpawner made this reflector): a
                # fresh future, which start() resolves, so readers waiting for a first load are told.
                self.first_load_future = asyncio.get_running_loop().create_future()
            await self.start()
        except Exception as exc:  # noqa: BLE001 - any failure means: not yet, try again later
            now = time.monotonic()
            if now - self._last_said >= BACKOFF_MAX:
                self._last_said = now
                down = now - (self.gave_up_at or now)
                self.log.warning(
                    "The %s watch is still down (%.0f s): the Kubernetes API server does not answer (%s)",
                    self.kind,
                    down,
                    str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__,
                )
            return False
        down = time.monotonic() - (self.gave_up_at or time.monotonic())
        self.gave_up_at = None
        self.log.warning("The %s watch is back after %.0f s without it; the hub's view is whole again", self.kind, down)
        try:
            self.on_recovered()
        except Exception:  # a listener's failure must not take the watch down again
            log.exception("A listener of the %s watch's recovery failed", self.kind)
        return True

    async def kick(self, wait: float = KICK_WAIT, restart: bool = False) -> None:
        """A reader needs a live view: if the watch is down, try now (not at the backoff's next turn) and wait
        up to ``wait`` s for that try; ``restart``: list and watch afresh even if the watch runs (KubeSpawner's
        "replace" when a pod did not appear or disappear in time). Never raises: a reader goes on with the last
        view, which :attr:`loaded` says whether to trust."""
        if self._stopping:
            return
        if restart and self.watching:
            task = self.watch_task
            task.cancel()
            await asyncio.wait([task])
        if self.watching:
            return
        self.gave_up_at = self.gave_up_at or time.monotonic()
        self._wake.set()
        await asyncio.wait([self._ensure_keeper()], timeout=wait)

    async def stop(self) -> None:
        """Stop the keeper too: a reflector that was stopped on purpose stays stopped."""
        self._stopping = True
        if self._keeper is not None and not self._keeper.done():
            self._keeper.cancel()
        await super().stop()


@functools.cache
def kept(reflector_class: type) -> type:
    """``reflector_class`` (KubeSpawner's ``PodReflector``, ``EventReflector``) with ``KeptWatch`` in front, once."""
    if issubclass(reflector_class, KeptWatch):
        return reflector_class
    return type(f"Kept{reflector_class.__name__}", (KeptWatch, reflector_class), {"__module__": __name__})


class KeptWatches(_SpawnerBase):
    """The spawner's side (a mixin in front of KubeSpawner): its reflectors are kept, its poll remembers the pod.

    ``watch_recovered`` is what a reflector calls when its watch is back
    (the spawner wakes the policy's reconciler)."""

    def watch_recovered(self) -> None:
        """Called on the event loop when a watch is back after giving up; overridden by the spawner."""

    async def _start_reflector(self, kind: str, reflector_class: type, replace: bool = False, **kwargs: Any) -> Any:
        """KubeSpawner's shared reflector for ``kind``, kept watching (``KeptWatch``); its one private hook we use.

        Upstream KubeSpawner has no public hook for this (jupyterhub/kubespawner#938, "Don't reuse a
        reflector that stopped watching", an open pull request): the reflector classes are fixed inside
        ``_start_watching_pods``/``_start_watching_events``, ``_start_reflector`` passes no ``on_failure``
        in one-namespace mode, and its fast path hands out a reflector whose watch has ended. So this
        override (i) has KubeSpawner build our ``kept`` subclass of its reflector class, (ii) restarts a
        watch that is down in place, on the same object, instead of KubeSpawner's ``replace`` (which
        stores a new, empty reflector before its first list, so an unreachable API server would make
        every pod look gone), and (iii) refuses to answer from a reflector that never listed anything.
        Raises ``KubernetesUnavailableError`` then: a poll that raises keeps the server (JupyterHub logs it)."""
        key = self._get_reflector_key(kind)
        current = type(self).reflectors.get(key)
        if isinstance(current, KeptWatch) and not current._stopping:
            if not current.first_load_future.done():
                await asyncio.wait([current.first_load_future])  # KubeSpawner's first start is under way
            await current.kick(restart=replace)
        else:
            current = await super()._start_reflector(kind, kept(reflector_class), replace=replace, **kwargs)
        current.on_recovered = self.watch_recovered
        if not current.loaded:
            await current.kick()
            if not current.loaded:
                raise KubernetesUnavailableError(
                    f"the Kubernetes API server has not answered the hub's {kind} watch yet"
                )
        return current

    def last_pod(self) -> Mapping[str, Any] | None:
        """The pod as the last poll saw it (None: never seen by a poll of this spawner)."""
        return getattr(self, "_pod_seen", None)

    async def poll(self) -> int | None:
        """KubeSpawner's poll; the pod it saw is remembered, so why it ended can be told after it is gone."""
        status = await super().poll()
        reflector = self.pod_reflector
        pod = reflector.pods.get(f"{self.namespace}/{self.pod_name}") if reflector is not None else None
        if pod is not None:
            self._pod_seen = pod
        return status
