"""Server sizes: the CPU and memory a start gets, picked by resource profile.

Sizing is apart from the GPU policy: it does not depend on quotas or the
ledger, only on what the operator offers (``resource_profiles``) and what
the user picked (the ``profile`` option, already checked by admission). A
profile sets only the start it was picked for; the next start without one
gets the default profile, never the last one used.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from traitlets import Dict, List, TraitError, observe, validate
from traitlets.config import Configurable
from traitlets.utils.bunch import Bunch

from workbench_spawner.ledger import endings, reasons
from workbench_spawner.ledger.endings import Ending
from workbench_spawner.rules.profiles import ProfileError, ResourceProfile, parse_profiles, pick_profile


class ServerSizing(Configurable):
    """The ``resource_profiles`` trait, ``size_server`` and the larger profile an out-of-memory end offers; a
    base of GPUSpawnerMixin.

    Not a Spawner itself (it spawns nothing); it goes before Spawner in the
    bases, so ``cpu_limit``/``mem_limit`` are the spawner's own traits.
    """

    if TYPE_CHECKING:  # the Spawner's, which this base reads (it comes before Spawner in GPUSpawnerMixin's bases)
        log: logging.Logger
        user: Any
        name: str
        cpu_limit: float | None
        mem_limit: int | None

    resource_profiles = List(
        Dict(),
        help="""
        Named CPU and memory sizes offered on the spawn form (``profile``
        option), e.g. ``[{"slug": "small", "cpu_limit": 2, "mem_limit": "8G"},
        {"slug": "large", "cpu_limit": 16, "mem_limit": "64G", "default": True}]``.
        Keys: ``slug`` (what the API takes), ``display_name``, ``description``,
        ``cpu_limit`` (cores), ``mem_limit`` (bytes or K/M/G/T), ``default``. A
        limit a profile leaves out stays at the spawner's ``cpu_limit`` /
        ``mem_limit``. The docker backend enforces the limits; the local
        backend only passes them on as ``CPU_LIMIT``/``MEM_LIMIT``. Empty: no
        choice, every server gets the spawner's limits.
        """,
    ).tag(config=True)

    @validate("resource_profiles")
    def _check_resource_profiles(self, proposal: Bunch) -> list[dict[str, Any]]:
        value: list[dict[str, Any]] = proposal["value"]
        try:
            parse_profiles(value)
        except ProfileError as exc:
            raise TraitError(str(exc)) from exc
        return value

    # Parsed once when configured, not on every form and spawn.
    _parsed_profiles: tuple[ResourceProfile, ...] = ()

    @observe("resource_profiles")
    def _parse_resource_profiles(self, change: Bunch) -> None:
        self._parsed_profiles = tuple(parse_profiles(change["new"]))

    # Whether the runtime holds a server to its cpu_limit/mem_limit (containers
    # do; a local process only sees them as CPU_LIMIT/MEM_LIMIT). The form says so.
    enforces_resource_limits = False

    @property
    def gpu_profiles(self) -> Sequence[ResourceProfile]:
        return self._parsed_profiles

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # What the configuration says, so that a profile picked for one start
        # does not stick to the next start without one.
        self._configured_limits = (self.cpu_limit, self.mem_limit)

    def size_server(self, slug: str | None) -> ResourceProfile | None:
        """Set cpu_limit/mem_limit for this start from the profile ``slug`` (or the default one)."""
        profile = pick_profile(self.gpu_profiles, slug)
        self.cpu_limit, self.mem_limit = (
            profile.limits(*self._configured_limits) if profile else self._configured_limits
        )
        if profile:
            self.log.info(
                "Server %s of %s: resource profile %s (%s)",
                self.name or "(default)",
                self.user.name,
                profile.slug,
                profile.summary(),
            )
        return profile

    def with_larger_profile(self, ending: Ending) -> Ending:
        """An out-of-memory end names the limit the server hit and the resource profile that offers more."""
        if ending.reason != reasons.OUT_OF_MEMORY:
            return ending
        limit = ending.limit_bytes or (int(self.mem_limit) if self.mem_limit else None)
        if limit and not ending.limit_bytes:
            ending = endings.out_of_memory(limit)
        larger = sorted(
            (p for p in self.gpu_profiles if p.mem_limit and (limit is None or p.mem_limit > limit)),
            key=lambda p: p.mem_limit or 0,
        )
        if not larger:
            return ending
        offer = larger[0]
        return replace(
            ending,
            hint=f"Load less data at once, or start with the profile {offer.display_name} "
            f"({endings.gib(offer.mem_limit or 0)} of memory).",
        )
