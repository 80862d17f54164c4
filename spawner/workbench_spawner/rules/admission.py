"""Admission: may this user start this request now? Pure rules, no I/O.

Admission is apart from placement so that every backend asks the same
question the same way, before anything is started or submitted: on one host
our allocator then places the GPUs, on Slurm the engine does. Everything the
rules need is gathered first (``AdmissionContext``: the effective quota, what
the user's other servers hold, GPU-hours used, the inventory) by code that may
touch the database in a worker thread; ``admit`` itself is a plain function,
so a table test can list every refusal the product makes with its words and
HTTP status.

Admission counts what the user holds when it looks, so two spawns of one user
at once both pass it; the quota is enforced again where the lease is written
(``ledger.lease_limits``), with the same sentences (``rules.quota``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from workbench_devices.mig import profile_size
from workbench_spawner.form.options import OptionError, SpawnRequest, device_matches, parse_options
from workbench_spawner.rules.quota import EffectiveQuota, ServerHolding, budget_spent, over_max_gpus
from workbench_spawner.rules.reservations import gpus_text


@dataclass(frozen=True)
class Refusal:
    """A request that may not start; ``message`` is shown to the user as it is."""

    message: str
    status: int = 400
    reason: str = "bad_options"  # "bad_options" | "quota"


class NoGPUAvailableError(Exception):
    """A spawn admitted but refused at placement; str(err) is meant for the user.

    Nothing could be placed within the wait (503), or the lease met its limits where it is written
    (``ledger.lease_limits.QuotaExceededError``, 403). ``status`` and ``reason`` are what the spawn's
    ``SpawnException`` carries (JupyterHub's answer to the REST API and the spawn page); a subclass that
    refuses for another cause says its own. Defined with admission's refusal, below both the ledger and
    placement, so the ledger can raise it without importing placement (``placement.host`` re-exports it)."""

    status: int = 503
    reason: str = "no_gpu"


@dataclass(frozen=True)
class Admitted:
    """A request that may start, with the GPU model chosen where the quota narrows it."""

    request: SpawnRequest
    # The session length in force now (None: no limit); a later quota change
    # does not touch a server that already started.
    max_session_hours: float | None = None


def image_refusal(backend: str, environment: str) -> str:
    """Why an image cannot be picked on a backend whose servers all run ``environment`` (the refusal of an
    ``image`` option, and the hub's refusal to start with images offered there)."""
    return f"This hub's {backend} servers all run {environment}; an image cannot be chosen here."


@dataclass(frozen=True)
class AdmissionContext:
    """What the rules look at, gathered once per spawn."""

    quota: EffectiveQuota
    inventory_size: int
    inventory_models: Sequence[str] = ()
    # What each of the user's other servers holds now (by name, for the refusal's sentence).
    others: Sequence[ServerHolding] = ()
    gpu_hours_used: float = 0.0
    free_by_model: Mapping[str, int] = field(default_factory=dict)
    default_gpus: int = 1
    cpu_servers_allowed: bool = True
    contact: str = "a hub admin"
    offered_images: Sequence[str] = ()
    # The sentence an ``image`` option is refused with where the backend runs no picked image (``image_refusal``).
    image_refusal: str = ""
    profiles: Sequence[str] = ()
    # MIG slices by profile and model ({"1g.18gb": {"H200-141GB": 7}}); inventory_size counts whole GPUs.
    slices: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    pins_slices: bool = True  # False: the backend hands out whole GPUs only
    # Every device with how many servers may hold it (``PolicySettings.slots_for``), given only where
    # the hub time-slices some device and places GPUs itself; empty: no device is shared.
    sharing: Sequence[tuple[Any, int]] = ()

    @property
    def held_elsewhere(self) -> int:
        """Devices the user's other servers hold now."""
        return sum(o.devices for o in self.others)

    @property
    def budget_spent(self) -> bool:
        budget = self.quota.quota.gpu_hours_per_week
        return budget is not None and self.gpu_hours_used >= budget

    def allowed_now(self) -> int:
        """GPUs one more server may ask for now (0 when the week's GPU-hours are spent)."""
        if self.budget_spent:
            return 0
        # The most one server can get: all the whole GPUs, or one slice (a CUDA program sees one MIG device).
        largest = max(self.inventory_size, 1 if any(sum(m.values()) for m in self.slices.values()) else 0)
        return max(0, min(self.quota.quota.max_gpus - self.held_elsewhere, largest))

    def offered_models(self) -> list[str]:
        """Models of this hub the quota lets the user have."""
        return [m for m in self.inventory_models if self.quota.quota.allows_model(m)]


def admit(options: Mapping[str, Any] | None, ctx: AdmissionContext) -> Admitted | Refusal:
    """Check ``options`` (form or REST, already normalised) against the rules."""
    verdict = _admit(options, ctx)
    if isinstance(verdict, Refusal):
        return verdict
    request = _unshared(verdict.request, ctx)
    return request if isinstance(request, Refusal) else replace(verdict, request=request)


def _unshared(request: SpawnRequest, ctx: AdmissionContext) -> SpawnRequest | Refusal:
    """A quota that forbids time-sliced GPUs (``shared_gpus`` false) gets only devices of the asked kind
    that one server holds alone: the request is marked ``exclusive`` for placement, or refused in words
    where too few such devices exist."""
    if not request.gpus or ctx.quota.quota.shared_gpus or all(slots == 1 for _, slots in ctx.sharing):
        return request
    matching = [slots for device, slots in ctx.sharing if device_matches(device, request.kind)]
    alone = sum(1 for slots in matching if slots == 1)
    if alone >= request.gpus:
        return replace(request, exclusive=True)
    source = ctx.quota.describe
    what = gpus_text(request.gpus, request.kind)
    if not alone:
        most = max(matching, default=1)
        why = f"every {what.split(' ', 1)[1].rstrip('s')} here is time-sliced (shared by up to {most} servers)"
    else:
        why = f"only {alone} of them here {'is' if alone == 1 else 'are'} not time-sliced"
    return Refusal(
        f"Cannot start the server: you asked for {what}, but {source} allows no time-sliced GPUs and {why}. "
        f"Ask for another kind of GPU or fewer, or ask {ctx.contact} to allow time-sliced GPUs for you.",
        403,
        "quota",
    )


def _admit(options: Mapping[str, Any] | None, ctx: AdmissionContext) -> Admitted | Refusal:
    quota = ctx.quota.quota
    source = ctx.quota.describe
    allowed = ctx.allowed_now()
    ask = f"ask {ctx.contact} to raise your GPU quota"
    if (options or {}).get("gpu_profile") is not None and not ctx.pins_slices:
        return Refusal(
            "Cannot start the server: this hub's backend hands out whole GPUs only, not MIG slices; "
            "ask for whole GPUs (gpus, and gpu_model if you need one).",
            400,
            "bad_options",
        )
    if (options or {}).get("image") is not None and ctx.image_refusal:
        return Refusal(ctx.image_refusal, 400, "bad_options")
    try:
        request = parse_options(
            options,
            inventory_size=ctx.inventory_size,
            models=ctx.inventory_models,
            default_gpus=min(ctx.default_gpus, allowed),
            allowed_images=ctx.offered_images,
            profiles=ctx.profiles,
            slices=ctx.slices if ctx.pins_slices else {},
        )
    except OptionError as exc:
        return Refusal(f"Cannot start the server: {exc}.", 400, "bad_options")
    one = _one_slice(request, ctx, defaulted=(options or {}).get("gpus") is None)
    if isinstance(one, Refusal):
        return one
    request = one
    if request.gpus == 0 and not ctx.cpu_servers_allowed:
        return Refusal(
            "Cannot start the server: CPU-only servers are switched off on this hub; ask for at least one GPU.",
            403,
            "quota",
        )
    budget = quota.gpu_hours_per_week
    if request.gpus and budget is not None and ctx.budget_spent:
        return Refusal(budget_spent(source, budget, ctx.gpu_hours_used, ctx.contact), 403, "quota")
    if request.gpus > allowed:
        return Refusal(
            over_max_gpus(request.gpus, bool(request.gpu_profile), source, quota.max_gpus, ctx.others, ctx.contact),
            403,
            "quota",
        )
    if request.gpus and ctx.pins_slices:
        kind = _slice_or_whole(request, ctx, source, ask)
        if isinstance(kind, Refusal):
            return kind
        request = kind
    if request.gpu_profile:
        return Admitted(request, quota.max_session_hours)  # its model, if any, was checked with the slice
    models = quota.allowed_models
    if request.gpus and models is not None:
        if request.gpu_model is not None and not quota.allows_model(request.gpu_model):
            return Refusal(
                f"Cannot start the server: {source} allows only these GPU models: "
                f"{', '.join(models) or 'none'}, not {request.gpu_model}. Pick one of those, or {ask}.",
                403,
                "quota",
            )
        if request.gpu_model is None:
            offered = ctx.offered_models()
            if not offered:
                return Refusal(
                    f"Cannot start the server: {source} allows only GPU models this hub does not have "
                    f"({', '.join(models) or 'none'}). Start a CPU-only server (0 GPUs), or {ask}.",
                    403,
                    "quota",
                )
            if len(offered) < len(ctx.inventory_models):
                # Only allowed models may be handed out: the allowed model with
                # the most free GPUs now (placement places by model).
                best = max(offered, key=lambda m: (ctx.free_by_model.get(m, 0), -offered.index(m)))
                request = replace(request, gpu_model=best)
    return Admitted(request, quota.max_session_hours)


def _one_slice(request: SpawnRequest, ctx: AdmissionContext, defaulted: bool) -> SpawnRequest | Refusal:
    """A server gets one MIG slice at most.

    A CUDA process enumerates a single MIG device, however many are visible
    (NVIDIA's MIG User Guide, "CUDA Device Enumeration"): a second slice would
    be leased and charged but never usable. More room on MIG is a larger
    profile. A request for several slices (a profile named, or one
    ``_slice_or_whole`` will pick because whole GPUs are not to be had) is
    refused in words that offer only what the quota allows; a hub's
    ``default_gpus`` of more than one gives a slice request one. A request
    the quota refuses anyway (a profile it does not allow, a whole GPU by
    model) is left to that refusal, which says why."""
    quota = ctx.quota.quota

    def usable(profile: str) -> bool:
        return quota.allows_profile(profile) and any(quota.allows_model(m) for m in ctx.slices.get(profile, {}))

    whole = bool(ctx.inventory_size) and quota.allows_profile("")
    asked = request.gpu_profile
    allowed = [p for p in ctx.slices if usable(p)]
    by_model = request.gpu_model is not None and bool(ctx.inventory_size)  # a whole GPU of a model, by name
    sliced = usable(asked) if asked else bool(allowed) and not whole and not by_model
    if request.gpus <= 1 or not sliced or not ctx.pins_slices:
        return request
    if defaulted:
        return replace(request, gpus=1)
    larger = [p for p in allowed if asked and _larger(p, asked)]
    instead = "one slice" if asked else f"one slice ({', '.join(allowed)})"
    if larger:
        instead += f"{',' if whole else ' or'} one of a larger profile ({', '.join(larger)})"
    if whole:
        instead += " or whole GPUs"
    return Refusal(
        f"Cannot start the server: a server gets one MIG slice at most, not {request.gpus} slices"
        f"{f' of {asked}' if asked else ''}: a CUDA program sees only one MIG slice, so the others could not "
        f"be used. Ask for {instead}.",
        400,
        "bad_options",
    )


def _larger(profile: str, than: str) -> bool:
    """Whether ``profile`` has at least the compute and memory of ``than``, and more of one (2g.35gb > 1g.18gb);
    False where either is no profile name (an engine's resource name may be anything)."""
    size, size0 = profile_size(profile), profile_size(than)
    return (
        size is not None
        and size0 is not None
        and size != size0
        and all(a >= b for a, b in zip(size, size0, strict=True))
    )


def _slice_or_whole(request: SpawnRequest, ctx: AdmissionContext, source: str, ask: str) -> SpawnRequest | Refusal:
    """The quota's rules by kind: whole GPUs or slices, which profiles, which models.

    A request that names no profile gets a slice where the quota allows no
    whole GPU or the hub has none: the allowed profile with the most free
    slices now (as a model is chosen for a quota that narrows models)."""
    quota = ctx.quota.quota
    profile = request.gpu_profile
    if profile is None:
        if quota.allows_profile("") and ctx.inventory_size:
            return request
        allowed = [p for p in ctx.slices if quota.allows_profile(p)]
        if request.gpu_model is not None and ctx.inventory_size:  # a whole GPU of a model, by name
            slices = f"only MIG slices of {', '.join(allowed)}" if allowed else "no MIG slice either"
            return Refusal(
                f"Cannot start the server: {source} allows no whole GPUs ({slices}), so not a whole "
                f"{request.gpu_model}. {'Ask for a slice' if allowed else 'Start a CPU-only server (0 GPUs)'}, "
                f"or {ask}.",
                403,
                "quota",
            )
        if not allowed:
            has = "has no whole GPUs" if not ctx.inventory_size else "allows no whole GPUs"
            why = f"this hub {has}" if not ctx.inventory_size else f"{source} {has}"
            offered = ", ".join(ctx.slices) or "none"
            return Refusal(
                f"Cannot start the server: {why}, and no MIG slice it has may be yours (its slices: {offered}). "
                f"Start a CPU-only server (0 GPUs), or {ask}.",
                403,
                "quota",
            )

        def free(profile: str) -> int:
            return sum(ctx.free_by_model.get(f"{m} {profile}", 0) for m in ctx.slices[profile])

        profile = max(allowed, key=lambda p: (free(p), -allowed.index(p)))
        request = replace(request, gpu_profile=profile)
    if not quota.allows_profile(profile):
        listed = quota.allowed_profiles
        only = f"only MIG slices of {', '.join(listed)}" if listed else "no MIG slices"
        return Refusal(
            f"Cannot start the server: {source} allows {only}, not {profile}. "
            f"Ask for {'one of those' if listed else 'whole GPUs'}, or {ask}.",
            403,
            "quota",
        )
    by_model = ctx.slices[profile]
    models = [m for m in by_model if request.gpu_model in (None, m) and quota.allows_model(m)]
    if not models:
        return Refusal(
            f"Cannot start the server: {source} allows only these GPU models: "
            f"{', '.join(quota.allowed_models or ()) or 'none'}, and this hub has {profile} slices only on "
            f"{', '.join(by_model)}. Ask for another slice, or {ask}.",
            403,
            "quota",
        )
    if request.gpu_model is None and len(models) < len(by_model):
        best = max(models, key=lambda m: (ctx.free_by_model.get(f"{m} {profile}", 0), -models.index(m)))
        request = replace(request, gpu_model=best)
    return request
